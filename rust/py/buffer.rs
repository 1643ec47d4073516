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
use pyo3::types::{PyList, PyTuple};

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
        let mut view = Box::new(MaybeUninit::<ffi::Py_buffer>::uninit());
        // SAFETY: `view` is valid writable memory for one `Py_buffer`, which
        // PyObject_GetBuffer fills completely when it returns 0 and leaves unowned otherwise.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_SIMPLE) };
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
