//! Thin pyo3 wrappers around the pure-Rust cores, and the exceptions they raise.

use pyo3::import_exception;

pub mod auth;
mod buffer;
pub mod header;
pub mod latency;
mod provenance;
pub mod queue;
mod queue_stats;
pub mod shm;

// The exceptions are servo's own (`servo.errors`, under `servo.ServoError`): one error tree for
// Python and Rust alike, so `except servo.ServoError` catches what the core raises too.
import_exception!(servo.errors, HeaderError);
import_exception!(servo.errors, QueueError);
import_exception!(servo.errors, AuthError);
