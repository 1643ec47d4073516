//! Python wrapper of [`crate::queue::Provenance`]: where an action comes from.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::queue;

/// Where an action comes from (its chunk, and the step it is meant for); a frozen, tuple-like record.
#[pyclass(module = "servo._core", name = "Provenance", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyProvenance(pub queue::Provenance);

/// The 16-byte session id from its 32-character hex text (any case).
fn session_bytes(text: &str) -> PyResult<[u8; 16]> {
    let bad = || {
        PyValueError::new_err(format!(
            "session_id {text:?} is not 32 hexadecimal characters (16 bytes)"
        ))
    };
    if text.len() != 32 || !text.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

fn session_hex(bytes: &[u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[pymethods]
impl PyProvenance {
    #[new]
    #[pyo3(signature = (session_id, seq_id, episode_id, obs_mono_ns, step = 0))]
    fn new(
        session_id: &str,
        seq_id: u64,
        episode_id: u64,
        obs_mono_ns: i64,
        step: u64,
    ) -> PyResult<Self> {
        Ok(Self(queue::Provenance {
            session_id: session_bytes(session_id)?,
            seq_id,
            episode_id,
            obs_mono_ns,
            step,
        }))
    }

    #[classattr]
    fn __match_args__() -> (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    ) {
        ("session_id", "seq_id", "episode_id", "obs_mono_ns", "step")
    }

    #[getter]
    fn session_id(&self) -> String {
        session_hex(&self.0.session_id)
    }

    #[getter]
    fn seq_id(&self) -> u64 {
        self.0.seq_id
    }

    #[getter]
    fn episode_id(&self) -> u64 {
        self.0.episode_id
    }

    #[getter]
    fn obs_mono_ns(&self) -> i64 {
        self.0.obs_mono_ns
    }

    #[getter]
    fn step(&self) -> u64 {
        self.0.step
    }

    fn same_chunk(&self, other: &Self) -> bool {
        self.0.same_chunk(&other.0)
    }

    fn __repr__(&self) -> String {
        let p = &self.0;
        format!(
            "Provenance(session_id='{}', seq_id={}, episode_id={}, obs_mono_ns={}, step={})",
            session_hex(&p.session_id),
            p.seq_id,
            p.episode_id,
            p.obs_mono_ns,
            p.step
        )
    }

    fn __len__(&self) -> usize {
        5
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.as_tuple(py)?.as_any().get_item(index)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.as_tuple(py)?.as_any().try_iter()?.into_any())
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        Ok((slf.get_type().into_any(), slf.get().as_tuple(slf.py())?))
    }
}

impl PyProvenance {
    fn as_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let p = &self.0;
        (
            session_hex(&p.session_id),
            p.seq_id,
            p.episode_id,
            p.obs_mono_ns,
            p.step,
        )
            .into_pyobject(py)
    }
}
