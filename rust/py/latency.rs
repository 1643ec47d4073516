//! Python wrapper of [`crate::latency::LatencyTracker`]. `add`/`max`/`count` are O(1) and
//! keep the GIL; `percentile(s)` release it around the O(window) copy and the sort.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::latency::{LatencyError, LatencyTracker};

fn latency_err(err: LatencyError) -> PyErr {
    PyValueError::new_err(err.to_string())
}

/// Sliding-window latency samples (ns) on the monotonic clock.
#[pyclass(module = "servo._core", name = "LatencyTracker", frozen)]
pub struct PyLatencyTracker {
    inner: LatencyTracker,
}

#[pymethods]
impl PyLatencyTracker {
    #[new]
    #[pyo3(signature = (window = 100))]
    fn new(window: i64) -> PyResult<Self> {
        let window = usize::try_from(window).unwrap_or(0);
        Ok(Self {
            inner: LatencyTracker::new(window).map_err(latency_err)?,
        })
    }

    #[getter]
    fn window(&self) -> usize {
        self.inner.window()
    }

    fn add(&self, ns: i64) -> PyResult<()> {
        self.inner.add(ns).map_err(latency_err)
    }

    fn max(&self) -> Option<u64> {
        self.inner.max()
    }

    fn percentile(&self, py: Python<'_>, q: f64) -> PyResult<Option<u64>> {
        py.detach(|| self.inner.percentile(q)).map_err(latency_err)
    }

    fn percentiles(&self, py: Python<'_>, qs: Vec<f64>) -> PyResult<Option<Vec<u64>>> {
        py.detach(|| self.inner.percentiles(&qs))
            .map_err(latency_err)
    }

    fn count(&self) -> usize {
        self.inner.count()
    }

    fn reset(&self) {
        self.inner.reset();
    }

    fn __repr__(&self) -> String {
        format!(
            "LatencyTracker(window={}, count={})",
            self.inner.window(),
            self.inner.count()
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLatencyTracker>()
}
