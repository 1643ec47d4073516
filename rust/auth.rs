//! Session-key exchange and server identity (no pyo3 here); the session cipher that uses the
//! exchanged secret is [`crate::cipher`].
//!
//! * **Key exchange.** Each side makes an ephemeral X25519 [`KeyPair`] and sends only its public
//!   key; both derive the session secret with BLAKE3 `derive_key` ([`KEY_CONTEXT`]) over
//!   shared secret || client public || server public || session id, so the secret never
//!   crosses the wire and is bound to the session it was made for. A low-order peer key (an
//!   all-zero shared secret) is refused. [`KeyPair::session_key`] returns this side's
//!   [`SessionKey`] (its role follows from which public key is its own).
//! * **Server identity.** A long-lived Ed25519 [`ServerIdentity`] signs what a server
//!   publishes about itself; edges pin the public keys they trust ([`verify_signature`], strict
//!   RFC 8032 verification: no malleable signatures, no small-order keys).
//! * **Keyless notices** ([`unauthenticated`]): a header with an all-zero tag, which no key
//!   ever accepts.

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::cipher::{attachment, Role, SessionKey};
use crate::header::{Header, HeaderError, ATTACHMENT_SIZE, SESSION_ID_SIZE, TAG_SIZE};

/// Size of a session secret (and of each key derived from it).
pub const KEY_SIZE: usize = 32;
/// Size of an X25519 or Ed25519 public key.
pub const PUBLIC_KEY_SIZE: usize = 32;
/// Size of an Ed25519 seed (the secret half of a [`ServerIdentity`]).
pub const SEED_SIZE: usize = 32;
/// Size of an Ed25519 signature.
pub const SIGNATURE_SIZE: usize = 64;
/// BLAKE3 `derive_key` context of session secrets: changing the derivation means a new string
/// (v3: the secret keys the AES-256-GCM lanes of [`crate::cipher`]; v2 keyed a BLAKE3 MAC).
pub const KEY_CONTEXT: &str = "servo 2026-11 session key v3";

/// Why a message, key or signature input was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// An input of the wrong size, e.g. `what = "attachment"`.
    Length {
        what: &'static str,
        len: usize,
        expected: usize,
    },
    /// The tag is all zero: a keyless notice, never accepted by any key.
    ZeroTag,
    /// The tag does not match header || body under this key.
    TagMismatch,
    /// This side of the session does not send messages of this type.
    Direction { role: &'static str, msg_type: u8 },
    /// The seq_id is not above the last one encrypted for its message type under this key:
    /// the nonce would repeat.
    NonceReuse { msg_type: u8, seq_id: u64 },
    /// The tag matched but the header does not decode.
    Header(HeaderError),
    /// Key-exchange public keys that do not fit together (the message says how).
    Roles(&'static str),
    /// The peer's X25519 key is of low order: the shared secret would be all zero.
    LowOrderPeer,
    /// A public key that is no Ed25519 point.
    NotAPoint,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length {
                what,
                len,
                expected,
            } => write!(f, "{what} is {len} bytes, expected {expected}"),
            Self::ZeroTag => write!(f, "zero tag: the message is unauthenticated"),
            Self::TagMismatch => write!(f, "tag mismatch"),
            Self::Direction { role, msg_type } => {
                write!(f, "a {role} does not send msg_type {msg_type}")
            }
            Self::NonceReuse { msg_type, seq_id } => write!(
                f,
                "seq_id {seq_id} of msg_type {msg_type} is not above the last one sent under \
                 this key (its nonce would repeat)"
            ),
            Self::Header(err) => err.fmt(f),
            Self::Roles(msg) => write!(f, "{msg}"),
            Self::NotAPoint => write!(f, "public_key is not an Ed25519 public key"),
            Self::LowOrderPeer => write!(
                f,
                "peer public key is of low order (all-zero shared secret)"
            ),
        }
    }
}

impl std::error::Error for AuthError {}

/// Checks an input's length and returns it as an array.
pub fn fixed<const N: usize>(what: &'static str, bytes: &[u8]) -> Result<[u8; N], AuthError> {
    bytes.try_into().map_err(|_| AuthError::Length {
        what,
        len: bytes.len(),
        expected: N,
    })
}

/// `header` followed by a zero tag, for the few keyless notices (e.g. "unknown session").
pub fn unauthenticated(header: &Header) -> Result<[u8; ATTACHMENT_SIZE], HeaderError> {
    Ok(attachment(&header.encode()?, &[0u8; TAG_SIZE]))
}

/// The session secret both sides derive from an X25519 shared secret (see the module docs).
pub fn derive_session_secret(
    shared_secret: &[u8; 32],
    client_public: &[u8; PUBLIC_KEY_SIZE],
    server_public: &[u8; PUBLIC_KEY_SIZE],
    session_id: &[u8; SESSION_ID_SIZE],
) -> Zeroizing<[u8; KEY_SIZE]> {
    let mut hasher = blake3::Hasher::new_derive_key(KEY_CONTEXT);
    hasher.update(shared_secret);
    hasher.update(client_public);
    hasher.update(server_public);
    hasher.update(session_id);
    Zeroizing::new(*hasher.finalize().as_bytes())
}

/// An ephemeral X25519 key pair; [`KeyPair::session_key`] consumes it (one exchange only).
pub struct KeyPair {
    secret: Zeroizing<[u8; 32]>,
    public: [u8; PUBLIC_KEY_SIZE],
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl KeyPair {
    /// A fresh key pair from the OS random number generator.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut secret = Zeroizing::new([0u8; 32]);
        getrandom::fill(secret.as_mut())?;
        Ok(Self::from_secret(secret))
    }

    /// The key pair of a given secret scalar (clamped as RFC 7748 says).
    pub fn from_secret(secret: Zeroizing<[u8; 32]>) -> Self {
        let public = x25519_dalek::x25519(*secret, x25519_dalek::X25519_BASEPOINT_BYTES);
        Self { secret, public }
    }

    /// The public key to send to the peer.
    pub fn public_key(&self) -> [u8; PUBLIC_KEY_SIZE] {
        self.public
    }

    /// Derives this side's key of the session shared with `peer_public`.
    ///
    /// `client_public` and `server_public` name the roles: this pair's public key must be one
    /// of them and `peer_public` the other, so both sides hash them in the same order; the
    /// key's [`Role`] is the one this pair's public key holds.
    pub fn session_key(
        self,
        peer_public: &[u8; PUBLIC_KEY_SIZE],
        client_public: &[u8; PUBLIC_KEY_SIZE],
        server_public: &[u8; PUBLIC_KEY_SIZE],
        session_id: &[u8; SESSION_ID_SIZE],
    ) -> Result<SessionKey, AuthError> {
        self.check_roles(peer_public, client_public, server_public)?;
        let shared = Zeroizing::new(x25519_dalek::x25519(*self.secret, *peer_public));
        if bool::from(shared.ct_eq(&[0u8; 32])) {
            return Err(AuthError::LowOrderPeer);
        }
        let role = if self.public == *client_public {
            Role::Client
        } else {
            Role::Server
        };
        let secret = derive_session_secret(&shared, client_public, server_public, session_id);
        Ok(SessionKey::new(&secret, role))
    }

    /// The checks of [`KeyPair::session_key`] that do not use the secret: this pair's public
    /// key is one of `client_public`/`server_public` and `peer_public` the other.
    pub fn check_roles(
        &self,
        peer_public: &[u8; PUBLIC_KEY_SIZE],
        client_public: &[u8; PUBLIC_KEY_SIZE],
        server_public: &[u8; PUBLIC_KEY_SIZE],
    ) -> Result<(), AuthError> {
        if client_public == server_public {
            return Err(AuthError::Roles(
                "client_public and server_public are the same key",
            ));
        }
        let peer_role = if self.public == *client_public {
            server_public
        } else if self.public == *server_public {
            client_public
        } else {
            return Err(AuthError::Roles(
                "this key pair's public key is neither client_public nor server_public",
            ));
        };
        if peer_public != peer_role {
            return Err(AuthError::Roles(
                "peer_public is not the other party's public key",
            ));
        }
        Ok(())
    }
}

/// A server's long-lived Ed25519 signing key. Never printed.
pub struct ServerIdentity(SigningKey);

impl fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("public_key", &self.public_key())
            .finish_non_exhaustive()
    }
}

impl ServerIdentity {
    /// A fresh identity from the OS random number generator.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut seed = Zeroizing::new([0u8; SEED_SIZE]);
        getrandom::fill(seed.as_mut())?;
        Ok(Self::from_seed(&seed))
    }

    /// The identity of a saved seed (RFC 8032 secret key).
    pub fn from_seed(seed: &[u8; SEED_SIZE]) -> Self {
        Self(SigningKey::from_bytes(seed))
    }

    /// The seed, to save the identity to a file.
    pub fn seed(&self) -> Zeroizing<[u8; SEED_SIZE]> {
        Zeroizing::new(self.0.to_bytes())
    }

    /// The public key edges pin.
    pub fn public_key(&self) -> [u8; PUBLIC_KEY_SIZE] {
        self.0.verifying_key().to_bytes()
    }

    /// Signs `message` (deterministic Ed25519).
    pub fn sign(&self, message: &[u8]) -> [u8; SIGNATURE_SIZE] {
        self.0.sign(message).to_bytes()
    }

    /// This identity's X25519 public key: the Montgomery form of its Ed25519 key (what
    /// [`exchange_public_key`] gives anyone who knows the identity).
    pub fn exchange_public_key(&self) -> [u8; PUBLIC_KEY_SIZE] {
        self.0.verifying_key().to_montgomery().to_bytes()
    }

    /// This identity's end of a session with the holder of the ephemeral key `peer_public`,
    /// exchanged with the X25519 form of its Ed25519 secret (RFC 8032's secret scalar, as
    /// libsodium's `crypto_sign_ed25519_sk_to_curve25519`): so records can be encrypted to a
    /// key known only as an identity (see [`KeyPair::session_key`] for the arguments).
    pub fn session_key(
        &self,
        peer_public: &[u8; PUBLIC_KEY_SIZE],
        client_public: &[u8; PUBLIC_KEY_SIZE],
        server_public: &[u8; PUBLIC_KEY_SIZE],
        session_id: &[u8; SESSION_ID_SIZE],
    ) -> Result<SessionKey, AuthError> {
        // The public half is the Montgomery form of the Ed25519 key: no scalar multiplication.
        let pair = KeyPair {
            secret: Zeroizing::new(self.0.to_scalar_bytes()),
            public: self.exchange_public_key(),
        };
        pair.session_key(peer_public, client_public, server_public, session_id)
    }
}

/// The X25519 public key of the identity whose Ed25519 public key is `public_key` (its
/// Montgomery form): what a record encrypted to that identity is exchanged with.
pub fn exchange_public_key(
    public_key: &[u8; PUBLIC_KEY_SIZE],
) -> Result<[u8; PUBLIC_KEY_SIZE], AuthError> {
    VerifyingKey::from_bytes(public_key)
        .map(|key| key.to_montgomery().to_bytes())
        .map_err(|_| AuthError::NotAPoint)
}

/// True if `signature` is `public_key`'s strict Ed25519 signature of `message`. Never fails:
/// a public key that is not a valid point is simply not a signer.
pub fn verify_signature(
    public_key: &[u8; PUBLIC_KEY_SIZE],
    message: &[u8],
    signature: &[u8; SIGNATURE_SIZE],
) -> bool {
    VerifyingKey::from_bytes(public_key).is_ok_and(|key| {
        key.verify_strict(message, &Signature::from_bytes(signature))
            .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::tests::{golden, unhex};
    use crate::header::{MSG_CHUNK, MSG_OBS};

    fn arr<const N: usize>(hex: &str) -> [u8; N] {
        unhex(hex).try_into().unwrap()
    }

    fn header(msg_type: u8, seq_id: u64) -> Header {
        Header {
            msg_type,
            seq_id,
            ..golden()[0].0
        }
    }

    #[test]
    fn keyless_notices_carry_a_zero_tag() {
        let header = header(crate::header::MSG_ERROR, 4);
        let zero = unauthenticated(&header).unwrap();
        assert_eq!(&zero[crate::header::HEADER_SIZE..], &[0; TAG_SIZE]);
        assert_eq!(Header::decode(&zero), Ok(header));
    }

    // RFC 7748 section 6.1 (Alice and Bob).
    const ALICE_SECRET: &str = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
    const ALICE_PUBLIC: &str = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";
    const BOB_SECRET: &str = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb";
    const BOB_PUBLIC: &str = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f";
    const SHARED: &str = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";

    fn pair(secret: &str) -> KeyPair {
        KeyPair::from_secret(Zeroizing::new(arr(secret)))
    }

    #[test]
    fn rfc7748_vectors() {
        // Section 5.2, first vector: the scalar multiplication itself.
        assert_eq!(
            x25519_dalek::x25519(
                arr("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4"),
                arr("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c"),
            ),
            arr::<32>("c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552")
        );
        assert_eq!(pair(ALICE_SECRET).public_key(), arr::<32>(ALICE_PUBLIC));
        assert_eq!(pair(BOB_SECRET).public_key(), arr::<32>(BOB_PUBLIC));
        let (client, server) = (arr(ALICE_PUBLIC), arr(BOB_PUBLIC));
        let sid = [7u8; SESSION_ID_SIZE];
        let expected = derive_session_secret(&arr(SHARED), &client, &server, &sid);
        let alice = pair(ALICE_SECRET)
            .session_key(&server, &client, &server, &sid)
            .unwrap();
        let bob = pair(BOB_SECRET)
            .session_key(&client, &client, &server, &sid)
            .unwrap();
        assert_eq!((alice.role(), bob.role()), (Role::Client, Role::Server));
        // Both ends hold the keys of the expected secret: each opens what the other sealed.
        let reference = SessionKey::new(&expected, Role::Server);
        let (attachment, body) = alice.encrypt(&header(MSG_OBS, 1), b"obs").unwrap();
        assert_eq!(reference.decrypt(&attachment, &body).unwrap().1, b"obs");
        assert_eq!(bob.decrypt(&attachment, &body).unwrap().1, b"obs");
        // Pinned: both ends of every deployed version must agree on the derivation. BLAKE3
        // derive_key over the RFC 7748 shared secret || Alice's public || Bob's public || 07*16
        // under KEY_CONTEXT (computed with the blake3 crate, whose derive_key mode its
        // official test vectors pin).
        assert_eq!(
            *expected,
            arr::<32>("920a4ba02750d9d4dec01b9d357fcf4bde37911d1b6fb53e47d65ad7b582c6ed")
        );
    }

    #[test]
    fn session_ids_separate_keys() {
        let (client, server) = (arr(ALICE_PUBLIC), arr(BOB_PUBLIC));
        let a = derive_session_secret(&arr(SHARED), &client, &server, &[1; 16]);
        let b = derive_session_secret(&arr(SHARED), &client, &server, &[2; 16]);
        let swapped = derive_session_secret(&arr(SHARED), &server, &client, &[1; 16]);
        assert_ne!(*a, *b);
        assert_ne!(*a, *swapped);
    }

    #[test]
    fn key_exchange_refusals() {
        let (client, server) = (arr(ALICE_PUBLIC), arr(BOB_PUBLIC));
        let sid = [0u8; 16];
        let refuse = |peer: [u8; 32], c: [u8; 32], s: [u8; 32]| {
            pair(ALICE_SECRET)
                .session_key(&peer, &c, &s, &sid)
                .unwrap_err()
        };
        assert_eq!(
            refuse(server, client, client).to_string(),
            "client_public and server_public are the same key"
        );
        assert_eq!(
            refuse(server, [9; 32], server).to_string(),
            "this key pair's public key is neither client_public nor server_public"
        );
        assert_eq!(
            refuse([9; 32], client, server).to_string(),
            "peer_public is not the other party's public key"
        );
        // Low-order points (u = 0 and u = 1) give an all-zero shared secret.
        for low in [
            [0u8; 32],
            arr("0100000000000000000000000000000000000000000000000000000000000000"),
        ] {
            assert_eq!(refuse(low, client, low), AuthError::LowOrderPeer);
        }
    }

    // RFC 8032 section 7.1, TEST 1 (empty message).
    const ED_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const ED_PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    const ED_SIGNATURE: &str = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";

    #[test]
    fn rfc8032_test_1() {
        let identity = ServerIdentity::from_seed(&arr(ED_SEED));
        assert_eq!(identity.public_key(), arr::<32>(ED_PUBLIC));
        assert_eq!(*identity.seed(), arr::<32>(ED_SEED));
        let signature = identity.sign(b"");
        assert_eq!(signature, arr::<64>(ED_SIGNATURE));
        assert!(verify_signature(&arr(ED_PUBLIC), b"", &signature));
        assert!(!verify_signature(&arr(ED_PUBLIC), b"x", &signature));
        let mut bad = signature;
        bad[63] ^= 0x10;
        assert!(!verify_signature(&arr(ED_PUBLIC), b"", &bad));
        // Garbage keys (not a point, a small-order point) are not signers; nothing panics.
        assert!(!verify_signature(&[0xff; 32], b"", &signature));
        assert!(!verify_signature(&[0; 32], b"", &[0; 64]));
        let mut identity_point = [0u8; 32];
        identity_point[0] = 1;
        assert!(!verify_signature(&identity_point, b"", &signature));
    }

    #[test]
    fn an_identity_exchanges_with_its_montgomery_form() {
        let identity = ServerIdentity::from_seed(&arr(ED_SEED));
        let exchange = exchange_public_key(&arr(ED_PUBLIC)).unwrap();
        assert_eq!(identity.exchange_public_key(), exchange);
        // libsodium's crypto_sign_ed25519_pk_to_curve25519 of RFC 8032 TEST 1's public key.
        assert_eq!(
            exchange,
            arr::<32>("d85e07ec22b0ad881537c2f44d662d1a143cf830c57aca4305d85c7a90f6b62e")
        );
        let sender = KeyPair::generate().unwrap();
        let ephemeral = sender.public_key();
        let sid = [5; SESSION_ID_SIZE];
        let client = sender
            .session_key(&exchange, &ephemeral, &exchange, &sid)
            .unwrap();
        let server = identity
            .session_key(&ephemeral, &ephemeral, &exchange, &sid)
            .unwrap();
        let header = Header {
            msg_type: MSG_OBS,
            ..golden()[0].0
        };
        let (attachment, body) = client.encrypt(&header, b"record").unwrap();
        assert_eq!(server.decrypt(&attachment, &body).unwrap().1, b"record");
        let mut not_a_point = [0u8; 32];
        not_a_point[0] = 2; // y = 2: (y² - 1) / (d·y² + 1) has no square root mod p
        assert_eq!(exchange_public_key(&not_a_point), Err(AuthError::NotAPoint));
    }

    #[test]
    fn secrets_are_not_printed() {
        let key = SessionKey::new(&[7; KEY_SIZE], Role::Client);
        assert_eq!(format!("{key:?}"), "SessionKey(client, ..)");
        let identity = ServerIdentity::from_seed(&arr(ED_SEED));
        assert!(!format!("{identity:?}").contains("157"));
        assert!(format!("{:?}", pair(ALICE_SECRET)).starts_with("KeyPair { public: [133, 32"));
    }

    #[test]
    fn generated_keys_differ() {
        let (a, b) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
        assert_ne!(a.public_key(), b.public_key());
        let (c, d) = (
            ServerIdentity::generate().unwrap(),
            ServerIdentity::generate().unwrap(),
        );
        assert_ne!(c.public_key(), d.public_key());
        let (client, server) = (a.public_key(), b.public_key());
        let ka = a.session_key(&server, &client, &server, &[3; 16]).unwrap();
        let kb = b.session_key(&client, &client, &server, &[3; 16]).unwrap();
        let (attachment, body) = kb.encrypt(&header(MSG_CHUNK, 9), b"chunk").unwrap();
        assert_eq!(ka.decrypt(&attachment, &body).unwrap().1, b"chunk");
    }
}
