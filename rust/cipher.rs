//! The session cipher: every message body of a session encrypted and authenticated (no pyo3).
//!
//! * **One AEAD, two lanes.** A session's [`SessionKey`] holds one lane per direction (client →
//!   server, server → client), each with its own AES-256-GCM key, derived from the session's
//!   exchange secret ([`crate::auth::derive_session_secret`]) with BLAKE3 `derive_key` under
//!   [`LANE_CONTEXTS`]. A key knows its [`Role`]: it encrypts only the message types its side
//!   sends and decrypts with the other side's lane, so a message reflected back to its sender,
//!   or replayed as another type, never verifies.
//! * **Message = header || tag, body = ciphertext.** The header ([`HEADER_SIZE`] bytes, in the
//!   clear: routing reads it) is the associated data; the body is encrypted; the tag
//!   ([`TAG_SIZE`] bytes) follows the header in the attachment, as the MAC did in schema 2. One
//!   pass over the body writes the ciphertext into the buffer that is sent.
//! * **Nonces never repeat under one key.** The 96-bit nonce is `msg_type || 0 0 0 || seq_id`
//!   (little-endian): the lane separates the directions, the message type the streams of one
//!   direction (observations and control requests; chunks, errors, drain notices and control
//!   acks). The receiver needs nothing but the header to rebuild it. The sender enforces
//!   uniqueness itself: each message type's seq_ids must strictly increase under one key
//!   ([`AuthError::NonceReuse`] otherwise), so no caller mistake can encrypt twice under one
//!   nonce (GCM's one fatal misuse). A server answer to an older request than one already
//!   answered is refused that way, and is worthless anyway: a client takes only the answer to
//!   its latest request.
//! * **Keyless notices.** An all-zero tag marks a keyless notice ([`crate::auth::unauthenticated`])
//!   and never verifies, whatever the key.
//! * **Proofs.** [`SessionKey::authenticate`] / [`SessionKey::verify`] tag data that never
//!   travels (a resume proof: the new open's key, which both ends know) with the lane's keyed
//!   BLAKE3 MAC, truncated to [`TAG_SIZE`] bytes.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, NONCE_LEN};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::auth::{AuthError, KEY_SIZE};
use crate::header::{
    split_attachment, Header, ATTACHMENT_SIZE, HEADER_SIZE, MSG_CHUNK, MSG_CONTROL,
    MSG_CONTROL_ACK, MSG_DRAIN, MSG_ERROR, MSG_OBS, TAG_SIZE,
};

/// BLAKE3 `derive_key` contexts of the lane keys, from the session secret: client → server
/// AEAD, server → client AEAD, client → server proof MAC, server → client proof MAC.
pub const LANE_CONTEXTS: [&str; 4] = [
    "servo 2026-11 session client-to-server aes-256-gcm v3",
    "servo 2026-11 session server-to-client aes-256-gcm v3",
    "servo 2026-11 session client-to-server proof v3",
    "servo 2026-11 session server-to-client proof v3",
];

/// Which end of a session a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The robot's end: sends observations and control requests.
    Client,
    /// The replica's end: sends chunks, errors, drain notices and control acks.
    Server,
}

impl Role {
    /// Whether this side sends messages of `msg_type`.
    pub fn sends(self, msg_type: u8) -> bool {
        match self {
            Self::Client => matches!(msg_type, MSG_OBS | MSG_CONTROL),
            Self::Server => {
                matches!(
                    msg_type,
                    MSG_CHUNK | MSG_ERROR | MSG_DRAIN | MSG_CONTROL_ACK
                )
            }
        }
    }

    /// The other end.
    pub fn peer(self) -> Self {
        match self {
            Self::Client => Self::Server,
            Self::Server => Self::Client,
        }
    }

    /// `"client"` or `"server"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Server => "server",
        }
    }
}

/// One direction's keys.
struct Lane {
    aead: LessSafeKey,
    mac: Zeroizing<[u8; KEY_SIZE]>,
}

impl Lane {
    fn derive(secret: &[u8; KEY_SIZE], aead_context: &str, mac_context: &str) -> Self {
        let aead = Zeroizing::new(blake3::derive_key(aead_context, secret));
        let key = UnboundKey::new(&AES_256_GCM, aead.as_slice())
            .unwrap_or_else(|_| unreachable!("AES-256 takes any 32-byte key"));
        Self {
            aead: LessSafeKey::new(key),
            mac: Zeroizing::new(blake3::derive_key(mac_context, secret)),
        }
    }

    fn mac<'a>(
        &self,
        header: &[u8; HEADER_SIZE],
        data: impl IntoIterator<Item = &'a [u8]>,
    ) -> [u8; TAG_SIZE] {
        keyed_tag(&self.mac, header, data)
    }
}

/// Keyed BLAKE3 of header || data parts, truncated to [`TAG_SIZE`] bytes.
pub fn keyed_tag<'a>(
    key: &[u8; KEY_SIZE],
    header: &[u8; HEADER_SIZE],
    data: impl IntoIterator<Item = &'a [u8]>,
) -> [u8; TAG_SIZE] {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(header);
    for part in data {
        hasher.update(part);
    }
    let mut tag = [0u8; TAG_SIZE];
    tag.copy_from_slice(&hasher.finalize().as_bytes()[..TAG_SIZE]);
    tag
}

/// The nonce of a message: `msg_type || 0 0 0 || seq_id` (little-endian).
pub fn nonce_bytes(msg_type: u8, seq_id: u64) -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    nonce[0] = msg_type;
    nonce[4..].copy_from_slice(&seq_id.to_le_bytes());
    nonce
}

/// One end of a session's keys. The key bytes are never printed; not `Clone` (a copy would
/// restart the nonce guard).
pub struct SessionKey {
    role: Role,
    outgoing: Lane,
    incoming: Lane,
    /// Per message type: 1 + the last seq_id encrypted (0: none yet).
    sent: [AtomicU64; 8],
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey({}, ..)", self.role.name())
    }
}

impl SessionKey {
    /// `role`'s end of the session whose exchange secret is `secret` (see the module docs).
    pub fn new(secret: &[u8; KEY_SIZE], role: Role) -> Self {
        let client = Lane::derive(secret, LANE_CONTEXTS[0], LANE_CONTEXTS[2]);
        let server = Lane::derive(secret, LANE_CONTEXTS[1], LANE_CONTEXTS[3]);
        let (outgoing, incoming) = match role {
            Role::Client => (client, server),
            Role::Server => (server, client),
        };
        Self {
            role,
            outgoing,
            incoming,
            sent: Default::default(),
        }
    }

    /// Which end this key is.
    pub fn role(&self) -> Role {
        self.role
    }

    fn outgoing_header(&self, header: &Header) -> Result<[u8; HEADER_SIZE], AuthError> {
        let encoded = header.encode().map_err(AuthError::Header)?;
        if !self.role.sends(header.msg_type) {
            return Err(AuthError::Direction {
                role: self.role.name(),
                msg_type: header.msg_type,
            });
        }
        Ok(encoded)
    }

    /// Takes `seq_id` of `msg_type`'s stream: it must be above every one taken before.
    fn reserve(&self, msg_type: u8, seq_id: u64) -> Result<(), AuthError> {
        let reused = || AuthError::NonceReuse { msg_type, seq_id };
        let next = seq_id.checked_add(1).ok_or_else(reused)?;
        self.sent[usize::from(msg_type & 7)]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                (next > last).then_some(next)
            })
            .map(drop)
            .map_err(|_| reused())
    }

    /// Encrypts `body` in place and returns the attachment (header || tag).
    ///
    /// Refuses a message type this side does not send, and a seq_id not above the last one of
    /// its type (the nonce would repeat); `body` is left untouched then.
    pub fn seal_in_place(
        &self,
        header: &Header,
        body: &mut [u8],
    ) -> Result<[u8; ATTACHMENT_SIZE], AuthError> {
        let encoded = self.outgoing_header(header)?;
        self.reserve(header.msg_type, header.seq_id)?;
        let nonce = Nonce::assume_unique_for_key(nonce_bytes(header.msg_type, header.seq_id));
        let tag = self
            .outgoing
            .aead
            .seal_in_place_separate_tag(nonce, Aad::from(&encoded), body)
            .unwrap_or_else(|_| unreachable!("AES-GCM seals any body below 64 GiB"));
        Ok(attachment(&encoded, tag.as_ref()))
    }

    /// Checks an attachment's tag over its header and the ciphertext in `body`, decrypting it
    /// in place; then decodes the header.
    ///
    /// Checks, in order: size, zero tag, tag (constant time, by the AEAD), header. Nothing
    /// about a message is trusted before its tag is, and `body` is zeroed when the tag does
    /// not match (no unauthenticated plaintext is left behind).
    pub fn open_in_place(&self, attachment: &[u8], body: &mut [u8]) -> Result<Header, AuthError> {
        let (header, tag) = split(attachment)?;
        // The nonce is built from bytes not yet authenticated: a wrong one fails the tag.
        let msg_type = header[4];
        let seq_id = u64::from_le_bytes(header[6..14].try_into().unwrap_or_default());
        let nonce = Nonce::assume_unique_for_key(nonce_bytes(msg_type, seq_id));
        let opened = self.role.peer().sends(msg_type)
            && self
                .incoming
                .aead
                .open_in_place_separate_tag(nonce, Aad::from(header), Tag::from(*tag), body, 0..)
                .is_ok();
        if !opened {
            body.fill(0);
            return Err(AuthError::TagMismatch);
        }
        Header::from_bytes(header).map_err(AuthError::Header)
    }

    /// The attachment proving this side holds the key for `data`, which does not travel
    /// (both ends know it): header || keyed BLAKE3 of header || data under this side's lane.
    pub fn authenticate<'a>(
        &self,
        header: &Header,
        data: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<[u8; ATTACHMENT_SIZE], AuthError> {
        let encoded = self.outgoing_header(header)?;
        Ok(attachment(&encoded, &self.outgoing.mac(&encoded, data)))
    }

    /// Checks the other side's [`SessionKey::authenticate`] proof over `data`, then decodes
    /// the header (length, zero tag, tag in constant time, header).
    pub fn verify<'a>(
        &self,
        attachment: &[u8],
        data: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Header, AuthError> {
        let (header, tag) = split(attachment)?;
        if !bool::from(self.incoming.mac(header, data).ct_eq(tag)) {
            return Err(AuthError::TagMismatch);
        }
        Header::from_bytes(header).map_err(AuthError::Header)
    }
}

/// An attachment's header and tag, refusing a wrong size and the zero tag.
fn split(attachment: &[u8]) -> Result<(&[u8; HEADER_SIZE], &[u8; TAG_SIZE]), AuthError> {
    let (header, tag) = split_attachment(attachment).ok_or(AuthError::Length {
        what: "attachment",
        len: attachment.len(),
        expected: ATTACHMENT_SIZE,
    })?;
    if *tag == [0u8; TAG_SIZE] {
        return Err(AuthError::ZeroTag);
    }
    Ok((header, tag))
}

/// `header` followed by `tag`.
pub fn attachment(header: &[u8; HEADER_SIZE], tag: &[u8]) -> [u8; ATTACHMENT_SIZE] {
    let mut out = [0u8; ATTACHMENT_SIZE];
    out[..HEADER_SIZE].copy_from_slice(header);
    out[HEADER_SIZE..].copy_from_slice(tag);
    out
}

#[cfg(test)]
#[path = "cipher/tests.rs"]
pub(crate) mod tests;
