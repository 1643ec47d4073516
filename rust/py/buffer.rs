//! Borrowing the bytes of any C-contiguous Python buffer, whatever its item type.
//!
//! `PyBuffer<u8>` refuses buffers whose items are not bytes (a float32 numpy array), and the
//! MAC hashes a message body as the bytes it is sent as, so this asks for the simplest export
//! (`PyBUF_SIMPLE`: contiguous, read as unsigned bytes).

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::pin::Pin;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

/// A read-only buffer export, released on drop.
///
/// Tied to `'py`: `Python<'py>` is not `Send`, so a `ByteView` cannot move into a `detach`
/// closure and is always dropped while attached to the interpreter (`PyBuffer_Release` needs
/// it). Slices borrowed from it are plain `&[u8]` and may cross `detach`.
pub struct ByteView<'py> {
    view: Pin<Box<ffi::Py_buffer>>,
    _py: PhantomData<Python<'py>>,
}

impl<'py> ByteView<'py> {
    /// Exports `obj`'s buffer; a `TypeError` for non-buffers and a `BufferError` for
    /// non-contiguous ones come from the object's own buffer implementation.
    pub fn get(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        Self::export(obj, ffi::PyBUF_SIMPLE)
    }

    /// Exports `obj`'s buffer for writing (a `bytearray`, a writable numpy array); a
    /// `BufferError` (or `TypeError`) for read-only ones comes from the object.
    pub fn get_writable(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        Self::export(obj, ffi::PyBUF_WRITABLE)
    }

    fn export(obj: &Bound<'py, PyAny>, flags: std::os::raw::c_int) -> PyResult<Self> {
        let mut view = Box::new(MaybeUninit::<ffi::Py_buffer>::uninit());
        // SAFETY: `view` is valid writable memory for one `Py_buffer`, which
        // PyObject_GetBuffer fills completely when it returns 0 and leaves unowned otherwise.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if rc == -1 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: PyObject_GetBuffer returned 0, so the struct is initialised (see above);
        // `MaybeUninit<T>` has the layout of `T`.
        let view = unsafe { Box::from_raw(Box::into_raw(view).cast::<ffi::Py_buffer>()) };
        Ok(Self {
            view: Box::into_pin(view),
            _py: PhantomData,
        })
    }

    /// The exported bytes.
    ///
    /// The exporter may let other code write to them meanwhile (a bytearray or an ndarray
    /// mutated by another thread): the same contract as numpy's own GIL-free copies, stated in
    /// the `.pyi` — a caller must not mutate a buffer while a call reads it.
    pub fn as_slice(&self) -> &[u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 {
            return &[];
        }
        // SAFETY: a successful PyBUF_SIMPLE export is `len` contiguous bytes at `buf`, valid
        // until PyBuffer_Release (in `drop`, which the borrow of `self` precedes).
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), len) }
    }

    /// The exported bytes, for writing; empty unless the export is writable
    /// ([`ByteView::get_writable`]). Same contract as [`ByteView::as_slice`].
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.readonly != 0 {
            return &mut [];
        }
        // SAFETY: a successful writable export is `len` contiguous bytes at `buf` that the
        // exporter lets us write, valid until PyBuffer_Release (in `drop`); `&mut self`
        // makes this the only slice of them handed out by this view.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), len) }
    }
}

impl Drop for ByteView<'_> {
    fn drop(&mut self) {
        // SAFETY: the export succeeded (only successful exports build a ByteView), is
        // released exactly once, here, and we are attached to the interpreter (type docs).
        // Py_buffer is plain data, so getting it out of the pin mutably moves nothing.
        unsafe { ffi::PyBuffer_Release(Pin::get_unchecked_mut(self.view.as_mut())) };
    }
}

/// A body: one buffer, or a list or tuple of buffers hashed as their concatenation.
pub fn body_views<'py>(body: &Bound<'py, PyAny>) -> PyResult<Vec<ByteView<'py>>> {
    if let Ok(parts) = body.cast::<PyList>() {
        parts.iter().map(|part| ByteView::get(&part)).collect()
    } else if let Ok(parts) = body.cast::<PyTuple>() {
        parts.iter().map(|part| ByteView::get(&part)).collect()
    } else {
        Ok(vec![ByteView::get(body)?])
    }
}

/// Runs `work` with the GIL released when `detach` (work long enough to be worth the hand-off:
/// large buffers), else holding it.
pub fn detach_if<T: Send>(py: Python<'_>, detach: bool, work: impl FnOnce() -> T + Send) -> T {
    if detach {
        py.detach(work)
    } else {
        work()
    }
}

/// A new `bytes` holding the concatenation of `parts`, then rewritten in place by `transform`
/// (encryption or decryption): one buffer, never zero-filled first. With `detach` the copy and
/// `transform` run with the GIL released.
pub fn transformed_bytes<'py, T: Send>(
    py: Python<'py>,
    parts: &[&[u8]],
    detach: bool,
    transform: impl FnOnce(&mut [u8]) -> T + Send,
) -> PyResult<(Bound<'py, PyBytes>, T)> {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    let size = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("body too large"))?;
    // SAFETY: a NULL source asks CPython for an uninitialised bytes object of `size` bytes
    // (for size 0 the shared empty one, to which nothing is written below).
    let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), size) };
    // SAFETY: `raw` is a new reference or NULL with an exception set.
    let bytes = unsafe { Bound::from_owned_ptr_or_err(py, raw)? }.cast_into::<PyBytes>()?;
    // SAFETY: the object is a bytes object of `len` bytes; its storage lives as long as `bytes`.
    let start = unsafe { ffi::PyBytes_AsString(bytes.as_ptr()) }.cast::<u8>() as usize;
    let work = move || {
        let ptr = start as *mut u8;
        let mut at = 0;
        for part in parts {
            // SAFETY: `ptr` points to `len` writable bytes of a bytes object nobody else can
            // see yet (it is not returned before this ends), and the parts add up to `len`;
            // the parts are caller buffers, distinct from this new object.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), ptr.add(at), part.len()) };
            at += part.len();
        }
        if len == 0 {
            return transform(&mut []);
        }
        // SAFETY: every one of the `len` bytes was initialised by the copies above; the
        // slice is the only reference to them until `transform` returns.
        transform(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    };
    Ok((bytes, detach_if(py, detach, work)))
}

/// The `bytes` an object without the buffer protocol converts to (`bytes(obj)`, e.g. a Zenoh
/// `ZBytes`), and whether the caller may rewrite them in place: true when they are a new
/// `bytes` object (at least 2 bytes long: shorter ones may be interned singletons) that only
/// this reference holds, so nobody else can see the change. None for buffers (read them with
/// [`ByteView`]).
pub fn converted_bytes<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<(Bound<'py, PyBytes>, bool)>> {
    // SAFETY: `obj` is a valid object; PyObject_CheckBuffer only reads its type.
    if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
        return Ok(None);
    }
    // SAFETY: PyObject_Bytes returns a new reference or NULL with an exception set.
    let raw = unsafe { ffi::PyObject_Bytes(obj.as_ptr()) };
    // SAFETY: see above.
    let bytes = unsafe { Bound::from_owned_ptr_or_err(obj.py(), raw)? }.cast_into::<PyBytes>()?;
    // SAFETY: `bytes` is a valid object; these only read its header.
    let exclusive = unsafe {
        ffi::PyBytes_CheckExact(bytes.as_ptr()) != 0 && ffi::Py_REFCNT(bytes.as_ptr()) == 1
    } && bytes.as_bytes().len() >= 2;
    Ok(Some((bytes, exclusive)))
}

/// Rewrites `bytes` in place with `transform`, with the GIL released when `detach`.
///
/// # Safety
/// `bytes` must be exclusively held by the caller ([`converted_bytes`] said so): nobody else
/// may read or hash it while it changes.
pub unsafe fn rewrite_exclusive<T: Send>(
    py: Python<'_>,
    bytes: &Bound<'_, PyBytes>,
    detach: bool,
    transform: impl FnOnce(&mut [u8]) -> T + Send,
) -> T {
    let len = bytes.as_bytes().len();
    // SAFETY: `bytes` is a bytes object, whose storage is `len` bytes that (by the caller's
    // contract) only the caller can reach; it lives as long as `bytes`, which outlives this call.
    let start = unsafe { ffi::PyBytes_AsString(bytes.as_ptr()) }.cast::<u8>() as usize;
    let work = move || {
        // SAFETY: see above; the slice is the only reference to the storage until it returns.
        transform(unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) })
    };
    detach_if(py, detach, work)
}
