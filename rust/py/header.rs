//! Python wrapper of [`crate::header`]. Every call copies at most 62 bytes, so none
//! releases the GIL (releasing and re-taking it would cost more than the work).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFrozenSet, PyInt};

use super::buffer::ByteView;
use super::HeaderError;
use crate::header::{self, Header, WireType, SESSION_ID_SIZE};

pub fn header_err(err: header::HeaderError) -> PyErr {
    HeaderError::new_err(err.to_string())
}

/// Lowercase hex, as `bytes.hex()` writes it (reprs of ids and public keys).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Converts a Python int to a field's wire type; out of range → `HeaderError` naming it.
fn field<T>(name: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<T>
where
    T: TryFrom<i128> + WireType,
{
    // i64, then u64: both are fast C conversions (i128 is slow under abi3).
    let wide = match obj.extract::<i64>() {
        Ok(v) => Some(i128::from(v)),
        Err(_) if obj.is_instance_of::<PyInt>() => obj.extract::<u64>().ok().map(i128::from),
        Err(err) => return Err(err),
    };
    match wide {
        Some(value) => header::field_value::<T>(name, value).map_err(header_err),
        None => Err(header_err(header::HeaderError::FieldRange {
            field: name,
            value: obj.str()?.to_string(),
            wire_type: T::NAME,
            min: T::MIN,
            max: T::MAX,
        })),
    }
}

/// A session id: `bytes` of exactly [`SESSION_ID_SIZE`].
fn session_id(obj: &Bound<'_, PyAny>) -> PyResult<[u8; SESSION_ID_SIZE]> {
    let bytes = obj.cast::<PyBytes>().map_err(|_| {
        let type_name = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        PyTypeError::new_err(format!("session_id must be bytes, not {type_name}"))
    })?;
    let bytes = bytes.as_bytes();
    bytes.try_into().map_err(|_| {
        HeaderError::new_err(format!(
            "session_id is {} bytes, expected {SESSION_ID_SIZE}",
            bytes.len()
        ))
    })
}

/// A decoded attachment header (frozen).
#[pyclass(module = "servo._core", name = "Header", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyHeader(pub Header);

#[pymethods]
impl PyHeader {
    // One argument per wire field, as in the Python signature.
    #[allow(clippy::too_many_arguments)]
    #[new]
    #[pyo3(signature = (schema_version, msg_type, flags, seq_id, episode_id, session_epoch, client_mono_ns, session_id))]
    fn new(
        schema_version: &Bound<'_, PyAny>,
        msg_type: &Bound<'_, PyAny>,
        flags: &Bound<'_, PyAny>,
        seq_id: &Bound<'_, PyAny>,
        episode_id: &Bound<'_, PyAny>,
        session_epoch: &Bound<'_, PyAny>,
        client_mono_ns: &Bound<'_, PyAny>,
        session_id: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Self(Header {
            schema_version: field("schema_version", schema_version)?,
            msg_type: field("msg_type", msg_type)?,
            flags: field("flags", flags)?,
            seq_id: field("seq_id", seq_id)?,
            episode_id: field("episode_id", episode_id)?,
            session_epoch: field("session_epoch", session_epoch)?,
            client_mono_ns: field("client_mono_ns", client_mono_ns)?,
            session_id: self::session_id(session_id)?,
        }))
    }

    #[getter]
    fn schema_version(&self) -> u16 {
        self.0.schema_version
    }

    #[getter]
    fn msg_type(&self) -> u8 {
        self.0.msg_type
    }

    #[getter]
    fn flags(&self) -> u8 {
        self.0.flags
    }

    #[getter]
    fn seq_id(&self) -> u64 {
        self.0.seq_id
    }

    #[getter]
    fn episode_id(&self) -> u32 {
        self.0.episode_id
    }

    #[getter]
    fn session_epoch(&self) -> u32 {
        self.0.session_epoch
    }

    #[getter]
    fn client_mono_ns(&self) -> i64 {
        self.0.client_mono_ns
    }

    #[getter]
    fn session_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.session_id)
    }

    /// A copy with some fields changed (validated like the constructor).
    #[pyo3(signature = (**changes))]
    fn replace(&self, changes: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut h = self.0;
        for (key, value) in changes.into_iter().flatten() {
            let key: String = key.extract()?;
            match key.as_str() {
                "schema_version" => h.schema_version = field("schema_version", &value)?,
                "msg_type" => h.msg_type = field("msg_type", &value)?,
                "flags" => h.flags = field("flags", &value)?,
                "seq_id" => h.seq_id = field("seq_id", &value)?,
                "episode_id" => h.episode_id = field("episode_id", &value)?,
                "session_epoch" => h.session_epoch = field("session_epoch", &value)?,
                "client_mono_ns" => h.client_mono_ns = field("client_mono_ns", &value)?,
                "session_id" => h.session_id = session_id(&value)?,
                other => {
                    return Err(PyTypeError::new_err(format!(
                        "replace() got an unexpected keyword argument '{other}'"
                    )))
                }
            }
        }
        Ok(Self(h))
    }

    fn __repr__(&self) -> String {
        let h = &self.0;
        format!(
            "Header(schema_version={}, msg_type={}, flags={}, seq_id={}, episode_id={}, \
             session_epoch={}, client_mono_ns={}, session_id=bytes.fromhex('{}'))",
            h.schema_version,
            h.msg_type,
            h.flags,
            h.seq_id,
            h.episode_id,
            h.session_epoch,
            h.client_mono_ns,
            hex(&h.session_id)
        )
    }
}

#[pyfunction]
fn decode_header(attachment: &Bound<'_, PyAny>) -> PyResult<PyHeader> {
    let decoded = match attachment.cast::<PyBytes>() {
        Ok(bytes) => Header::decode(bytes.as_bytes()),
        Err(_) => Header::decode(ByteView::get(attachment)?.as_slice()),
    };
    decoded.map(PyHeader).map_err(header_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyHeader>()?;
    m.add_function(wrap_pyfunction!(decode_header, m)?)?;
    m.add("HeaderError", py.get_type::<HeaderError>())?;
    m.add("HEADER_SIZE", header::HEADER_SIZE)?;
    m.add("TAG_SIZE", header::TAG_SIZE)?;
    m.add("ATTACHMENT_SIZE", header::ATTACHMENT_SIZE)?;
    m.add("SESSION_ID_SIZE", SESSION_ID_SIZE)?;
    m.add("HEADER_MAGIC", PyBytes::new(py, &header::HEADER_MAGIC))?;
    m.add("SCHEMA_VERSION", header::SCHEMA_VERSION)?;
    m.add(
        "SUPPORTED_SCHEMA_VERSIONS",
        PyFrozenSet::new(py, header::SUPPORTED_SCHEMA_VERSIONS)?,
    )?;
    m.add("MSG_OBS", header::MSG_OBS)?;
    m.add("MSG_CHUNK", header::MSG_CHUNK)?;
    m.add("MSG_ERROR", header::MSG_ERROR)?;
    m.add("MSG_DRAIN", header::MSG_DRAIN)?;
    m.add("MSG_CONTROL", header::MSG_CONTROL)?;
    m.add("MSG_CONTROL_ACK", header::MSG_CONTROL_ACK)?;
    m.add("FLAG_EPISODE_START", header::FLAG_EPISODE_START)?;
    m.add("FLAG_COPY", header::FLAG_COPY)?;
    Ok(())
}
