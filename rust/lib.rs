//! `servo._core`: the hot path of servo in Rust — the action chunk queue, the attachment
//! header codec, key exchange and identities, the session cipher, and the latency tracker. The
//! cores (`queue`, `header`, `auth`, `cipher`, `latency`) are plain Rust with no pyo3; `py`
//! wraps them for Python. This file is the module glue only.

pub mod auth;
pub mod cipher;
pub mod header;
pub mod latency;
mod py;
pub mod queue;
pub mod shm;

use pyo3::prelude::*;

/// `"release"` or `"debug"`: benchmarks refuse to measure a debug build.
const BUILD_PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("build_profile", BUILD_PROFILE)?;
    py::queue::register(m)?;
    py::shm::register(m)?;
    py::header::register(m)?;
    py::auth::register(m)?;
    py::latency::register(m)?;
    Ok(())
}
