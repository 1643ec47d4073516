//! Python wrapper of [`crate::queue::QueueStats`]: an ActionQueue's counters.

use pyo3::prelude::*;

use crate::queue;

/// Frozen snapshot of an ActionQueue's counters.
#[pyclass(module = "servo._core", name = "QueueStats", frozen, eq)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PyQueueStats(pub queue::QueueStats);

#[pymethods]
impl PyQueueStats {
    #[getter]
    fn merges(&self) -> u64 {
        self.0.merges
    }

    #[getter]
    fn rejected_merges(&self) -> u64 {
        self.0.rejected_merges
    }

    #[getter]
    fn delay_mismatches(&self) -> u64 {
        self.0.delay_mismatches
    }

    #[getter]
    fn actions_consumed(&self) -> u64 {
        self.0.actions_consumed
    }

    #[getter]
    fn superseded_reads(&self) -> u64 {
        self.0.superseded_reads
    }

    #[getter]
    fn qsize(&self) -> usize {
        self.0.qsize
    }

    #[getter]
    fn action_index(&self) -> u64 {
        self.0.action_index
    }

    fn __repr__(&self) -> String {
        let s = &self.0;
        format!(
            "QueueStats(merges={}, rejected_merges={}, delay_mismatches={}, \
             actions_consumed={}, superseded_reads={}, qsize={}, action_index={})",
            s.merges,
            s.rejected_merges,
            s.delay_mismatches,
            s.actions_consumed,
            s.superseded_reads,
            s.qsize,
            s.action_index
        )
    }
}
