//! Python wrappers of [`crate::shm`]: `SharedMemory` and its `Seqlock`, `Ring` and `Counters`
//! views. Every call copies at most a few hundred bytes and never waits, so they keep the GIL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use numpy::PyArray1;
use pyo3::exceptions::{PyIndexError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::buffer::ByteView;
use crate::shm::{words_for, Memory, Ring, Seqlock, ShmError, WORD};

fn shm_err(err: ShmError) -> PyErr {
    match err {
        ShmError::Layout(msg) => PyValueError::new_err(msg),
        ShmError::Os(err) => PyOSError::new_err(err.to_string()),
    }
}

/// `data`'s bytes as little-endian words (zero-padded), refusing more than `capacity` bytes.
fn to_words(data: &Bound<'_, PyAny>, capacity: usize, what: &str) -> PyResult<Vec<u64>> {
    let view = ByteView::get(data)?;
    let bytes = view.as_slice();
    if bytes.len() > capacity {
        return Err(PyValueError::new_err(format!(
            "{what} of {} bytes exceeds its {capacity} bytes",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks(WORD)
        .map(|chunk| {
            let mut word = [0u8; WORD];
            word[..chunk.len()].copy_from_slice(chunk);
            u64::from_le_bytes(word)
        })
        .collect())
}

fn to_bytes<'py>(py: Python<'py>, words: &[u64], len: usize) -> Bound<'py, PyBytes> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    PyBytes::new(py, &bytes[..len])
}

/// Memory shared between processes (a Linux memfd mapping), or private memory.
#[pyclass(module = "servo._core", name = "SharedMemory", frozen)]
pub struct PySharedMemory {
    pub(crate) inner: Arc<Memory>,
}

#[pymethods]
impl PySharedMemory {
    #[new]
    #[pyo3(signature = (size, *, shared = true))]
    fn new(size: usize, shared: bool) -> PyResult<Self> {
        if size == 0 {
            return Err(PyValueError::new_err("size is 0, expected size >= 1"));
        }
        let inner = if shared {
            Memory::shared(size).map_err(shm_err)?
        } else {
            Memory::private(size)
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    #[staticmethod]
    fn attach(fd: i32) -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(Memory::attach(fd).map_err(shm_err)?),
        })
    }

    fn fileno(&self) -> PyResult<i32> {
        self.inner
            .fd()
            .ok_or_else(|| PyValueError::new_err("private memory has no file descriptor"))
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn shared(&self) -> bool {
        self.inner.fd().is_some()
    }

    fn seqlock(&self, offset: usize, payload_bytes: usize) -> PyResult<PySeqlock> {
        let lock = PySeqlock {
            memory: self.inner.clone(),
            offset,
            payload_bytes,
        };
        lock.words()?;
        Ok(lock)
    }

    fn ring(&self, offset: usize, record_bytes: usize, capacity: usize) -> PyResult<PyRing> {
        if record_bytes == 0 || capacity == 0 {
            return Err(PyValueError::new_err(
                "a ring needs record_bytes >= 1 and capacity >= 1",
            ));
        }
        let ring = PyRing {
            memory: self.inner.clone(),
            offset,
            record_bytes,
            capacity,
        };
        ring.words()?;
        Ok(ring)
    }

    fn counters(&self, offset: usize, count: usize) -> PyResult<PyCounters> {
        let counters = PyCounters {
            memory: self.inner.clone(),
            offset,
            count,
        };
        counters.words()?;
        Ok(counters)
    }

    fn __repr__(&self) -> String {
        format!(
            "SharedMemory(size={}, shared={})",
            self.inner.len(),
            if self.shared() { "True" } else { "False" }
        )
    }
}

/// A newest-wins record in shared memory: one writer, any number of readers.
#[pyclass(module = "servo._core", name = "Seqlock", frozen)]
pub struct PySeqlock {
    memory: Arc<Memory>,
    offset: usize,
    payload_bytes: usize,
}

impl PySeqlock {
    fn words(&self) -> PyResult<&[AtomicU64]> {
        self.memory
            .words(self.offset, Seqlock::words(words_for(self.payload_bytes)))
            .map_err(shm_err)
    }
}

#[pymethods]
impl PySeqlock {
    #[staticmethod]
    fn size(payload_bytes: usize) -> usize {
        Seqlock::words(words_for(payload_bytes)) * WORD
    }

    #[getter]
    fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }

    fn write(&self, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut words = to_words(data, self.payload_bytes, "record")?;
        words.resize(words_for(self.payload_bytes), 0);
        Seqlock::new(self.words()?).write(&words);
        Ok(())
    }

    #[pyo3(signature = (attempts = 1))]
    fn read<'py>(&self, py: Python<'py>, attempts: usize) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let lock = Seqlock::new(self.words()?);
        let mut out = vec![0u64; lock.payload_words()];
        for _ in 0..attempts.max(1) {
            if lock.read(&mut out).is_some() {
                return Ok(Some(to_bytes(py, &out, self.payload_bytes)));
            }
            std::hint::spin_loop();
        }
        Ok(None)
    }

    #[getter]
    fn version(&self) -> PyResult<u64> {
        Ok(Seqlock::new(self.words()?).version())
    }
}

/// A single-producer single-consumer ring of fixed-size records in shared memory.
#[pyclass(module = "servo._core", name = "Ring", frozen)]
pub struct PyRing {
    memory: Arc<Memory>,
    offset: usize,
    record_bytes: usize,
    capacity: usize,
}

impl PyRing {
    fn words(&self) -> PyResult<&[AtomicU64]> {
        self.memory
            .words(
                self.offset,
                Ring::words(words_for(self.record_bytes), self.capacity),
            )
            .map_err(shm_err)
    }

    fn view(&self) -> PyResult<Ring<'_>> {
        Ok(Ring::new(
            self.words()?,
            words_for(self.record_bytes),
            self.capacity,
        ))
    }
}

#[pymethods]
impl PyRing {
    #[staticmethod]
    fn size(record_bytes: usize, capacity: usize) -> usize {
        Ring::words(words_for(record_bytes), capacity) * WORD
    }

    #[getter]
    fn record_bytes(&self) -> usize {
        self.record_bytes
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn push(&self, data: &Bound<'_, PyAny>) -> PyResult<bool> {
        let words = to_words(data, self.record_bytes, "record")?;
        Ok(self.view()?.push(&words))
    }

    fn pop<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let ring = self.view()?;
        let mut out = vec![0u64; ring.record_words()];
        Ok(ring
            .pop(&mut out)
            .then(|| to_bytes(py, &out, self.record_bytes)))
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.view()?.len())
    }

    #[getter]
    fn dropped(&self) -> PyResult<u64> {
        Ok(self.view()?.dropped())
    }
}

/// Unsigned 64-bit counters and flags in shared memory (atomic, any process).
#[pyclass(module = "servo._core", name = "Counters", frozen)]
pub struct PyCounters {
    memory: Arc<Memory>,
    offset: usize,
    count: usize,
}

impl PyCounters {
    fn words(&self) -> PyResult<&[AtomicU64]> {
        self.memory.words(self.offset, self.count).map_err(shm_err)
    }

    fn word(&self, index: usize) -> PyResult<&AtomicU64> {
        self.words()?.get(index).ok_or_else(|| {
            PyIndexError::new_err(format!(
                "counter {index} out of range (there are {})",
                self.count
            ))
        })
    }
}

#[pymethods]
impl PyCounters {
    #[staticmethod]
    fn size(count: usize) -> usize {
        count * WORD
    }

    fn __len__(&self) -> usize {
        self.count
    }

    fn get(&self, index: usize) -> PyResult<u64> {
        Ok(self.word(index)?.load(Ordering::Acquire))
    }

    fn set(&self, index: usize, value: u64) -> PyResult<()> {
        self.word(index)?.store(value, Ordering::Release);
        Ok(())
    }

    #[pyo3(signature = (index, delta = 1))]
    fn add(&self, index: usize, delta: u64) -> PyResult<u64> {
        Ok(self
            .word(index)?
            .fetch_add(delta, Ordering::AcqRel)
            .wrapping_add(delta))
    }

    fn max(&self, index: usize, value: u64) -> PyResult<u64> {
        Ok(self
            .word(index)?
            .fetch_max(value, Ordering::AcqRel)
            .max(value))
    }

    fn swap(&self, index: usize, value: u64) -> PyResult<u64> {
        Ok(self.word(index)?.swap(value, Ordering::AcqRel))
    }

    #[pyo3(signature = (start = 0, count = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        start: usize,
        count: Option<usize>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let words = self.words()?;
        let count = count.unwrap_or(self.count.saturating_sub(start));
        let slice = start
            .checked_add(count)
            .and_then(|end| words.get(start..end))
            .ok_or_else(|| {
                PyIndexError::new_err(format!(
                    "counters {start}..{} out of range (there are {})",
                    start + count,
                    self.count
                ))
            })?;
        let values: Vec<u64> = slice.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        Ok(PyArray1::from_vec(py, values))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySharedMemory>()?;
    m.add_class::<PySeqlock>()?;
    m.add_class::<PyRing>()?;
    m.add_class::<PyCounters>()?;
    Ok(())
}
