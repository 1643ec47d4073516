//! Python wrapper of [`crate::auth`] and [`crate::cipher`].
//!
//! GIL policy. `SessionKey.encrypt`/`decrypt`/`authenticate`/`verify` release the GIL while
//! they go over a body of at least [`DETACH_MIN_BYTES`] and keep it below. Measured on the
//! 2-core dev machine: copying and AES-256-GCM together take ~0.25 µs per KiB (~4 GB/s), keyed
//! BLAKE3 about as much. Releasing costs nothing measurable when no other thread wants the
//! GIL, but when one does (a CPU-bound Python thread), it takes the GIL and this thread waits
//! up to `sys.getswitchinterval()` (5 ms) to get it back: 64 KiB calls that released it took
//! up to 12 ms in that setting. So chunks (a few KiB) keep the GIL, and observations (~1 MB,
//! which would otherwise hold up the control-loop thread for hundreds of µs) release it. Key
//! exchange and signatures keep the GIL: ~0.1 ms at most, once per session or per status reply.

use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::buffer::{
    body_views, converted_bytes, detach_if, rewrite_exclusive, transformed_bytes, ByteView,
};
use super::header::{header_err, hex, PyHeader};
use super::{AuthError, HeaderError};
use crate::auth::{self, fixed, KEY_SIZE, PUBLIC_KEY_SIZE, SEED_SIZE, SIGNATURE_SIZE};
use crate::cipher::{self, Role};
use crate::header::SESSION_ID_SIZE;

/// Bodies at least this long are hashed with the GIL released (see the module docs).
pub const DETACH_MIN_BYTES: usize = 64 * 1024;

fn auth_err(err: auth::AuthError) -> PyErr {
    match err {
        auth::AuthError::Header(err) => HeaderError::new_err(err.to_string()),
        other => AuthError::new_err(other.to_string()),
    }
}

fn rng_err(err: getrandom::Error) -> PyErr {
    PyOSError::new_err(format!("the OS random number generator failed: {err}"))
}

fn sized<const N: usize>(what: &'static str, bytes: &[u8]) -> PyResult<[u8; N]> {
    fixed(what, bytes).map_err(auth_err)
}

fn parts<'a>(views: &'a [ByteView<'_>]) -> (Vec<&'a [u8]>, bool) {
    let parts: Vec<&[u8]> = views.iter().map(ByteView::as_slice).collect();
    let big = parts.iter().map(|p| p.len()).sum::<usize>() >= DETACH_MIN_BYTES;
    (parts, big)
}

/// The arguments of a key exchange, their lengths checked (naming the one that is wrong).
struct Exchange {
    peer: [u8; PUBLIC_KEY_SIZE],
    client: [u8; PUBLIC_KEY_SIZE],
    server: [u8; PUBLIC_KEY_SIZE],
    session_id: [u8; SESSION_ID_SIZE],
}

impl Exchange {
    fn sized(peer: &[u8], client: &[u8], server: &[u8], session_id: &[u8]) -> PyResult<Self> {
        Ok(Self {
            peer: sized("peer_public", peer)?,
            client: sized("client_public", client)?,
            server: sized("server_public", server)?,
            session_id: sized("session_id", session_id)?,
        })
    }
}

/// One end of a session's keys (frozen; the key bytes are never shown).
#[pyclass(module = "servo._core", name = "SessionKey", frozen)]
pub struct PySessionKey(cipher::SessionKey);

#[pymethods]
impl PySessionKey {
    #[new]
    #[pyo3(signature = (secret, *, role))]
    fn new(secret: &[u8], role: &str) -> PyResult<Self> {
        let secret = zeroize::Zeroizing::new(sized::<KEY_SIZE>("secret", secret)?);
        let role = match role {
            "client" => Role::Client,
            "server" => Role::Server,
            other => {
                return Err(PyValueError::new_err(format!(
                    "role {other:?} is not 'client' or 'server'"
                )))
            }
        };
        Ok(Self(cipher::SessionKey::new(&secret, role)))
    }

    #[getter]
    fn role(&self) -> &'static str {
        self.0.role().name()
    }

    fn encrypt<'py>(
        &self,
        py: Python<'py>,
        header: &Bound<'py, PyHeader>,
        body: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let header = header.get().0;
        let views = body_views(body)?;
        let (parts, big) = parts(&views);
        let (ciphertext, sealed) =
            transformed_bytes(py, &parts, big, |buf| self.0.seal_in_place(&header, buf))?;
        let attachment = sealed.map_err(auth_err)?;
        Ok((PyBytes::new(py, &attachment), ciphertext))
    }

    fn decrypt<'py>(
        &self,
        py: Python<'py>,
        attachment: &Bound<'py, PyAny>,
        ciphertext: &Bound<'py, PyAny>,
    ) -> PyResult<(PyHeader, Bound<'py, PyBytes>)> {
        let attachment = ByteView::get(attachment)?;
        let attachment = attachment.as_slice();
        let open = |buf: &mut [u8]| self.0.open_in_place(attachment, buf);
        if let Some((bytes, exclusive)) = converted_bytes(ciphertext)? {
            let big = bytes.as_bytes().len() >= DETACH_MIN_BYTES;
            if exclusive {
                // SAFETY: `converted_bytes` found these bytes new and held by this reference only.
                let opened = unsafe { rewrite_exclusive(py, &bytes, big, open) };
                return Ok((PyHeader(opened.map_err(auth_err)?), bytes));
            }
            let (plaintext, opened) = transformed_bytes(py, &[bytes.as_bytes()], big, open)?;
            return Ok((PyHeader(opened.map_err(auth_err)?), plaintext));
        }
        let views = [ByteView::get(ciphertext)?];
        let (parts, big) = parts(&views);
        let (plaintext, opened) = transformed_bytes(py, &parts, big, open)?;
        Ok((PyHeader(opened.map_err(auth_err)?), plaintext))
    }

    fn encrypt_in_place<'py>(
        &self,
        py: Python<'py>,
        header: &Bound<'py, PyHeader>,
        buffer: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let header = header.get().0;
        let mut view = ByteView::get_writable(buffer)?;
        let body = view.as_mut_slice();
        let big = body.len() >= DETACH_MIN_BYTES;
        let sealed = detach_if(py, big, || self.0.seal_in_place(&header, body));
        Ok(PyBytes::new(py, &sealed.map_err(auth_err)?))
    }

    fn authenticate<'py>(
        &self,
        py: Python<'py>,
        header: &Bound<'py, PyHeader>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let header = header.get().0;
        let views = body_views(data)?;
        let (parts, big) = parts(&views);
        let proof = detach_if(py, big, || {
            self.0.authenticate(&header, parts.iter().copied())
        });
        Ok(PyBytes::new(py, &proof.map_err(auth_err)?))
    }

    fn verify<'py>(
        &self,
        py: Python<'py>,
        attachment: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<PyHeader> {
        let attachment = ByteView::get(attachment)?;
        let attachment = attachment.as_slice();
        let views = body_views(data)?;
        let (parts, big) = parts(&views);
        let verified = detach_if(py, big, || self.0.verify(attachment, parts.iter().copied()));
        verified.map(PyHeader).map_err(auth_err)
    }

    fn __repr__(&self) -> String {
        format!("SessionKey(<secret>, role={:?})", self.0.role().name())
    }
}

/// An ephemeral X25519 key pair, usable for one key exchange.
#[pyclass(module = "servo._core", name = "KeyPair", frozen)]
pub struct PyKeyPair {
    inner: Mutex<Option<auth::KeyPair>>,
    public: [u8; PUBLIC_KEY_SIZE],
}

#[pymethods]
impl PyKeyPair {
    #[new]
    fn new() -> PyResult<Self> {
        let pair = auth::KeyPair::generate().map_err(rng_err)?;
        Ok(Self {
            public: pair.public_key(),
            inner: Mutex::new(Some(pair)),
        })
    }

    #[getter]
    fn public_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.public)
    }

    #[pyo3(signature = (peer_public, *, client_public, server_public, session_id))]
    fn session_key(
        &self,
        peer_public: &[u8],
        client_public: &[u8],
        server_public: &[u8],
        session_id: &[u8],
    ) -> PyResult<PySessionKey> {
        let Exchange {
            peer,
            client,
            server,
            session_id,
        } = Exchange::sized(peer_public, client_public, server_public, session_id)?;
        let used =
            || AuthError::new_err("this KeyPair was already used (key pairs are single-use)");
        // Nothing panics while the lock is held, so a poisoned lock still holds a valid slot.
        let mut slot = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        // Mistakes that do not touch the secret leave the pair usable.
        slot.as_ref()
            .ok_or_else(used)?
            .check_roles(&peer, &client, &server)
            .map_err(auth_err)?;
        let pair = slot.take().ok_or_else(used)?;
        pair.session_key(&peer, &client, &server, &session_id)
            .map(PySessionKey)
            .map_err(auth_err)
    }

    fn __repr__(&self) -> String {
        format!("KeyPair(public_key=bytes.fromhex('{}'))", hex(&self.public))
    }
}

/// A server's long-lived Ed25519 identity (frozen; the seed is never shown).
#[pyclass(module = "servo._core", name = "ServerIdentity", frozen)]
pub struct PyServerIdentity(auth::ServerIdentity);

#[pymethods]
impl PyServerIdentity {
    #[staticmethod]
    fn generate() -> PyResult<Self> {
        auth::ServerIdentity::generate().map(Self).map_err(rng_err)
    }

    #[staticmethod]
    fn from_seed(seed: &[u8]) -> PyResult<Self> {
        let seed = zeroize::Zeroizing::new(sized::<SEED_SIZE>("seed", seed)?);
        Ok(Self(auth::ServerIdentity::from_seed(&seed)))
    }

    #[getter]
    fn seed<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.0.seed().as_slice())
    }

    #[getter]
    fn public_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.public_key())
    }

    fn sign<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let message = ByteView::get(message)?;
        Ok(PyBytes::new(py, &self.0.sign(message.as_slice())))
    }

    #[getter]
    fn exchange_public_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.exchange_public_key())
    }

    #[pyo3(signature = (peer_public, *, client_public, server_public, session_id))]
    fn session_key(
        &self,
        peer_public: &[u8],
        client_public: &[u8],
        server_public: &[u8],
        session_id: &[u8],
    ) -> PyResult<PySessionKey> {
        let e = Exchange::sized(peer_public, client_public, server_public, session_id)?;
        self.0
            .session_key(&e.peer, &e.client, &e.server, &e.session_id)
            .map(PySessionKey)
            .map_err(auth_err)
    }

    fn __repr__(&self) -> String {
        format!(
            "ServerIdentity(public_key=bytes.fromhex('{}'))",
            hex(&self.0.public_key())
        )
    }
}

#[pyfunction]
fn verify_signature(
    public_key: &[u8],
    message: &Bound<'_, PyAny>,
    signature: &[u8],
) -> PyResult<bool> {
    let public_key = sized::<PUBLIC_KEY_SIZE>("public_key", public_key)?;
    let signature = sized::<SIGNATURE_SIZE>("signature", signature)?;
    let message = ByteView::get(message)?;
    Ok(auth::verify_signature(
        &public_key,
        message.as_slice(),
        &signature,
    ))
}

#[pyfunction]
fn exchange_public_key<'py>(py: Python<'py>, public_key: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let public_key = sized::<PUBLIC_KEY_SIZE>("public_key", public_key)?;
    let exchange = auth::exchange_public_key(&public_key).map_err(auth_err)?;
    Ok(PyBytes::new(py, &exchange))
}

#[pyfunction]
fn unauthenticated<'py>(
    py: Python<'py>,
    header: &Bound<'py, PyHeader>,
) -> PyResult<Bound<'py, PyBytes>> {
    let attachment = auth::unauthenticated(&header.get().0).map_err(header_err)?;
    Ok(PyBytes::new(py, &attachment))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PySessionKey>()?;
    m.add_class::<PyKeyPair>()?;
    m.add_class::<PyServerIdentity>()?;
    m.add_function(wrap_pyfunction!(verify_signature, m)?)?;
    m.add_function(wrap_pyfunction!(unauthenticated, m)?)?;
    m.add_function(wrap_pyfunction!(exchange_public_key, m)?)?;
    m.add("AuthError", py.get_type::<AuthError>())?;
    m.add("KEY_SIZE", KEY_SIZE)?;
    m.add("PUBLIC_KEY_SIZE", PUBLIC_KEY_SIZE)?;
    m.add("SEED_SIZE", SEED_SIZE)?;
    m.add("SIGNATURE_SIZE", SIGNATURE_SIZE)?;
    Ok(())
}
