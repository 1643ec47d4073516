//! Python wrapper of [`crate::queue::ActionQueue`].
//!
//! GIL policy. Methods that copy O(chunk) data (`merge`, `get_left_over`,
//! `get_processed_left_over`) release the GIL around the copy. The per-tick consumer methods
//! (`get`, `get_with_provenance`, `qsize`, `empty`, `get_action_index`, `get_position`,
//! `is_current`, `peek_provenance`, `clear`, `discard_chunk`) copy at most one row and never
//! wait, so they keep it: releasing the GIL on the control-loop thread would let another Python
//! thread take it, and the loop would then wait up to `sys.getswitchinterval()` (5 ms) to get it
//! back.

use std::borrow::Cow;

use numpy::ndarray::ArrayView2;
use numpy::{
    PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::provenance::PyProvenance;
use super::queue_stats::PyQueueStats;
use super::shm::PySharedMemory;
use super::QueueError;
use crate::queue::{self, ChunkRef, LeftOver};

fn queue_err(err: queue::QueueError) -> PyErr {
    match err {
        queue::QueueError::Config(msg) => PyValueError::new_err(msg),
        other => QueueError::new_err(other.to_string()),
    }
}

/// The chunk buffer between the inference side and the control loop.
#[pyclass(module = "servo._core", name = "ActionQueue", frozen)]
pub struct PyActionQueue {
    inner: queue::ActionQueue,
}

fn shape_repr(shape: &[usize]) -> String {
    match shape {
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Accepts an ndarray or anything `numpy.asarray` takes; requires float32 and 2 dimensions.
fn chunk_array<'py>(
    name: &str,
    obj: &Bound<'py, PyAny>,
    dim: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let py = obj.py();
    let array = match obj.cast::<PyUntypedArray>() {
        Ok(array) => array.clone(),
        Err(_) => py
            .import("numpy")?
            .getattr("asarray")?
            .call1((obj,))?
            .cast_into::<PyUntypedArray>()?,
    };
    let dtype = array.dtype();
    if !dtype.is_equiv_to(&numpy::dtype::<f32>(py)) {
        return Err(QueueError::new_err(format!(
            "{name} has dtype {}, expected float32",
            dtype.str()?
        )));
    }
    if array.ndim() != 2 {
        return Err(QueueError::new_err(format!(
            "{name} has shape {}, expected (T, {dim})",
            shape_repr(array.shape())
        )));
    }
    Ok(array.cast_into::<PyArray2<f32>>()?)
}

/// Borrows a validated chunk (`readonly` keeps numpy's borrow tracking honest).
fn readonly_chunk<'py>(
    name: &str,
    obj: &Bound<'py, PyAny>,
    dim: usize,
) -> PyResult<PyReadonlyArray2<'py, f32>> {
    chunk_array(name, obj, dim)?
        .try_readonly()
        .map_err(|e| QueueError::new_err(format!("{name}: {e}")))
}

/// A chunk's values in row-major order.
struct ChunkData<'a> {
    data: Cow<'a, [f32]>,
    rows: usize,
    cols: usize,
}

impl<'a> ChunkData<'a> {
    /// Borrows a C-contiguous view (ndarray's `as_slice` requires standard layout, unlike
    /// numpy's, which also accepts Fortran order); copies any other layout row by row.
    fn new(array: &'a ArrayView2<'_, f32>) -> Self {
        let data = match array.as_slice() {
            Some(slice) => Cow::Borrowed(slice),
            None => Cow::Owned(array.iter().copied().collect()),
        };
        Self {
            data,
            rows: array.nrows(),
            cols: array.ncols(),
        }
    }

    fn view(&self) -> ChunkRef<'_> {
        ChunkRef {
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

#[pymethods]
impl PyActionQueue {
    #[new]
    #[pyo3(signature = (action_dim, *, rtc, capacity = 4096))]
    fn new(action_dim: usize, rtc: bool, capacity: usize) -> PyResult<Self> {
        Ok(Self {
            inner: queue::ActionQueue::new(action_dim, rtc, capacity).map_err(queue_err)?,
        })
    }

    #[staticmethod]
    #[pyo3(signature = (action_dim, capacity = 4096))]
    fn shared_size(action_dim: usize, capacity: usize) -> PyResult<usize> {
        queue::ActionQueue::size_bytes(action_dim, capacity).map_err(queue_err)
    }

    #[staticmethod]
    #[pyo3(signature = (memory, offset, action_dim, *, rtc, capacity = 4096))]
    fn create(
        memory: &PySharedMemory,
        offset: usize,
        action_dim: usize,
        rtc: bool,
        capacity: usize,
    ) -> PyResult<Self> {
        let inner =
            queue::ActionQueue::create(memory.inner.clone(), offset, action_dim, rtc, capacity)
                .map_err(queue_err)?;
        Ok(Self { inner })
    }

    #[staticmethod]
    fn attach(memory: &PySharedMemory, offset: usize) -> PyResult<Self> {
        let inner = queue::ActionQueue::attach(memory.inner.clone(), offset).map_err(queue_err)?;
        Ok(Self { inner })
    }

    fn set_rtc(&self, rtc: bool) {
        self.inner.set_rtc(rtc);
    }

    fn discard_chunk(&self, provenance: Option<PyProvenance>) -> bool {
        self.inner.discard_chunk(provenance.map(|p| p.0))
    }

    #[getter]
    fn action_dim(&self) -> usize {
        self.inner.action_dim()
    }

    #[getter]
    fn rtc(&self) -> bool {
        self.inner.rtc()
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    #[pyo3(signature = (original, processed, real_delay, idx_before = None, *, provenance = None, since = None))]
    #[allow(clippy::too_many_arguments)]
    fn merge(
        &self,
        py: Python<'_>,
        original: &Bound<'_, PyAny>,
        processed: &Bound<'_, PyAny>,
        real_delay: i64,
        idx_before: Option<i64>,
        provenance: Option<PyProvenance>,
        since: Option<u64>,
    ) -> PyResult<usize> {
        if since.is_some() && idx_before.is_some() {
            self.inner.note_rejected();
            return Err(PyValueError::new_err(
                "merge takes idx_before (LeRobot's rule) or since (a position), not both",
            ));
        }
        let dim = self.inner.action_dim();
        let arrays = readonly_chunk("original", original, dim)
            .and_then(|o| Ok((o, readonly_chunk("processed", processed, dim)?)));
        let (original, processed) = arrays.inspect_err(|_| self.inner.note_rejected())?;
        let (original, processed) = (original.as_array(), processed.as_array());
        let provenance = provenance.map(|p| p.0);
        // The arrays stay borrowed while the GIL is released: like numpy's own GIL-free
        // copies, this assumes no other thread mutates them during the call.
        py.detach(|| {
            let (original, processed) = (ChunkData::new(&original), ChunkData::new(&processed));
            let (original, processed) = (original.view(), processed.view());
            match since {
                Some(position) => self
                    .inner
                    .merge_since(original, processed, position, real_delay, provenance),
                None => self
                    .inner
                    .merge(original, processed, real_delay, idx_before, provenance),
            }
        })
        .map_err(queue_err)
    }

    fn get<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f32>>> {
        self.pop(py).map(|(row, _)| row)
    }

    #[allow(clippy::type_complexity)]
    fn get_with_provenance<'py>(
        &self,
        py: Python<'py>,
    ) -> Option<(Bound<'py, PyArray1<f32>>, Option<PyProvenance>)> {
        self.pop(py)
            .map(|(row, provenance)| (row, provenance.map(PyProvenance)))
    }

    fn peek_provenance(&self) -> Option<PyProvenance> {
        self.inner.peek_provenance().map(PyProvenance)
    }

    fn qsize(&self) -> usize {
        self.inner.qsize()
    }

    fn empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn get_action_index(&self) -> u64 {
        self.inner.action_index()
    }

    fn get_position(&self) -> u64 {
        self.inner.position()
    }

    fn is_current(&self, position: u64) -> bool {
        self.inner.is_current(position)
    }

    #[pyo3(signature = (since = None))]
    fn get_left_over<'py>(
        &self,
        py: Python<'py>,
        since: Option<u64>,
    ) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        self.left_over(py, true, since)
    }

    #[pyo3(signature = (since = None))]
    fn get_processed_left_over<'py>(
        &self,
        py: Python<'py>,
        since: Option<u64>,
    ) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        self.left_over(py, false, since)
    }

    fn clear(&self) {
        self.inner.clear();
    }

    fn statistics(&self) -> PyQueueStats {
        PyQueueStats(self.inner.statistics())
    }

    fn __repr__(&self) -> String {
        format!(
            "ActionQueue(action_dim={}, rtc={}, capacity={}, qsize={})",
            self.inner.action_dim(),
            if self.inner.rtc() { "True" } else { "False" },
            self.inner.capacity(),
            self.inner.qsize()
        )
    }
}

impl PyActionQueue {
    /// Pops into a stack row (no allocation for the usual widths), then into a numpy array.
    #[allow(clippy::type_complexity)]
    fn pop<'py>(
        &self,
        py: Python<'py>,
    ) -> Option<(Bound<'py, PyArray1<f32>>, Option<queue::Provenance>)> {
        const STACK: usize = 64;
        let dim = self.inner.action_dim();
        let mut stack = [0f32; STACK];
        let mut heap = Vec::new();
        let row = if dim <= STACK {
            &mut stack[..dim]
        } else {
            heap.resize(dim, 0.0);
            &mut heap[..]
        };
        let provenance = self.inner.pop_into(row)?;
        Some((PyArray1::from_slice(py, row), provenance))
    }

    /// The leftover rows (from the consumer's index, or from `since`) as a `(rows, dim)` array.
    fn left_over<'py>(
        &self,
        py: Python<'py>,
        original: bool,
        since: Option<u64>,
    ) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        let left = py.detach(|| match since {
            Some(position) => self.inner.left_over_since(position, original),
            None if original => Ok(self.inner.left_over_original()),
            None => Ok(self.inner.left_over_processed()),
        });
        self.to_array(py, left.map_err(queue_err)?)
    }

    fn to_array<'py>(
        &self,
        py: Python<'py>,
        left: Option<LeftOver>,
    ) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        left.map(|left| {
            // `from_vec` hands the buffer to numpy without a copy.
            PyArray1::from_vec(py, left.values).reshape([left.rows, self.inner.action_dim()])
        })
        .transpose()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyActionQueue>()?;
    m.add_class::<PyProvenance>()?;
    m.add_class::<PyQueueStats>()?;
    m.add("QueueError", m.py().get_type::<QueueError>())?;
    Ok(())
}
