//! Thin pyo3 wrappers around the pure-Rust cores, and the exceptions they raise.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;

pub mod auth;
mod buffer;
pub mod header;
pub mod latency;
mod provenance;
pub mod queue;
mod queue_stats;
pub mod shm;

create_exception!(
    servo._core,
    HeaderError,
    PyValueError,
    "An attachment header could not be encoded or decoded."
);

create_exception!(
    servo._core,
    QueueError,
    PyValueError,
    "A chunk was rejected by ActionQueue.merge (dtype, shape, capacity or a stale position)."
);

create_exception!(
    servo._core,
    AuthError,
    PyValueError,
    "A message, key or signature input failed authentication or validation."
);
