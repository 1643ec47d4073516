//! The attachment header codec (no pyo3 here).
//!
//! Every servo message carries a fixed [`ATTACHMENT_SIZE`]-byte Zenoh attachment: the packed
//! header ([`HEADER_SIZE`] bytes) followed by a [`TAG_SIZE`]-byte tag: the AES-256-GCM tag of
//! the encrypted body with the header as associated data (computed and checked in
//! [`crate::cipher`]). Routing code peeks at the header with [`Header::decode`] before it knows
//! which session key applies; decoding never checks the tag. The header travels in the clear.
//!
//! Header layout, packed little-endian (schema version 3):
//!
//! | offset | size | field          | type |
//! |-------:|-----:|----------------|------|
//! | 0      | 2    | magic `b"SV"`  |      |
//! | 2      | 2    | schema_version | u16  |
//! | 4      | 1    | msg_type       | u8   |
//! | 5      | 1    | flags          | u8   |
//! | 6      | 8    | seq_id         | u64  |
//! | 14     | 4    | episode_id     | u32  |
//! | 18     | 4    | session_epoch  | u32  |
//! | 22     | 8    | client_mono_ns | i64  |
//! | 30     | 16   | session_id     | 16 opaque bytes (a random 128-bit id) |
//!
//! Message types: [`MSG_OBS`] (client → server), [`MSG_CHUNK`], [`MSG_ERROR`] and
//! [`MSG_DRAIN`] (server → client), [`MSG_CONTROL`] (an encrypted control request, client →
//! server: reset, close) and [`MSG_CONTROL_ACK`] (its encrypted answer). The message type is
//! under the tag and each direction has its own key, so a tagged message cannot be replayed in
//! the other direction or as another type.
//!
//! Schema versions 1 (30 bytes, no session id, no tag) and 2 (the same header, bodies only
//! authenticated by a keyed BLAKE3 MAC, not encrypted) are no longer accepted.

use std::fmt;

/// Encoded header size in bytes.
pub const HEADER_SIZE: usize = 46;
/// Size of the tag that follows the header in an attachment.
pub const TAG_SIZE: usize = 16;
/// Size of every attachment on the wire: header || tag.
pub const ATTACHMENT_SIZE: usize = HEADER_SIZE + TAG_SIZE;
/// Size of a session id.
pub const SESSION_ID_SIZE: usize = 16;
/// First two bytes of every header.
pub const HEADER_MAGIC: [u8; 2] = *b"SV";
/// The schema version this codec writes.
pub const SCHEMA_VERSION: u16 = 3;
/// Every schema version this codec can read and write.
pub const SUPPORTED_SCHEMA_VERSIONS: [u16; 1] = [3];
/// Observation (client → server).
pub const MSG_OBS: u8 = 1;
/// Action chunk (server → client).
pub const MSG_CHUNK: u8 = 2;
/// Error reply.
pub const MSG_ERROR: u8 = 3;
/// Drain notice (server → client).
pub const MSG_DRAIN: u8 = 4;
/// Control request (client → server), encrypted like every message of a session.
pub const MSG_CONTROL: u8 = 5;
/// Answer to a control request (server → client).
pub const MSG_CONTROL_ACK: u8 = 6;
/// Every known message type.
pub const MSG_TYPES: [u8; 6] = [
    MSG_OBS,
    MSG_CHUNK,
    MSG_ERROR,
    MSG_DRAIN,
    MSG_CONTROL,
    MSG_CONTROL_ACK,
];
/// The observation starts a new episode.
pub const FLAG_EPISODE_START: u8 = 1;
/// The observation is a copy of the request in flight, sent again under the next seq_id because
/// its answer is overdue: a server that still holds, serves or has answered the original answers
/// the copy from that instead of running another forward.
pub const FLAG_COPY: u8 = 2;

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Wire schema version.
    pub schema_version: u16,
    /// One of [`MSG_TYPES`].
    pub msg_type: u8,
    /// Bit set of `FLAG_*`; unknown bits are carried through untouched.
    pub flags: u8,
    /// Request sequence number (echoed in replies).
    pub seq_id: u64,
    /// Episode counter.
    pub episode_id: u32,
    /// Session epoch (bumped on every session (re)open).
    pub session_epoch: u32,
    /// The client's monotonic clock (ns): an opaque token the server echoes back.
    pub client_mono_ns: i64,
    /// The session this message belongs to (random, opaque; all zero outside a session).
    pub session_id: [u8; SESSION_ID_SIZE],
}

/// Why a header could not be encoded, decoded or built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Attachment of the wrong size.
    Length(usize),
    /// First two bytes are not [`HEADER_MAGIC`].
    Magic([u8; 2]),
    /// Schema version not in [`SUPPORTED_SCHEMA_VERSIONS`].
    SchemaVersion(u16),
    /// Message type not in [`MSG_TYPES`].
    MsgType(u8),
    /// A value that does not fit its field's wire type.
    FieldRange {
        field: &'static str,
        value: String,
        wire_type: &'static str,
        min: i128,
        max: i128,
    },
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length(n) => write!(f, "attachment is {n} bytes, expected {ATTACHMENT_SIZE}"),
            Self::Magic(magic) => write!(
                f,
                "bad magic {}, expected {}",
                bytes_repr(magic),
                bytes_repr(&HEADER_MAGIC)
            ),
            Self::SchemaVersion(v) => write!(
                f,
                "unsupported schema_version {v} (supported: {})",
                join(&SUPPORTED_SCHEMA_VERSIONS)
            ),
            Self::MsgType(t) => write!(f, "unknown msg_type {t} (known: {})", join(&MSG_TYPES)),
            Self::FieldRange {
                field,
                value,
                wire_type,
                min,
                max,
            } => write!(
                f,
                "{field}={value} does not fit {wire_type}, expected {min} <= {field} <= {max}"
            ),
        }
    }
}

impl std::error::Error for HeaderError {}

fn join<T: fmt::Display>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Python-style `bytes` repr, e.g. `b'SV'` or `b'\x00Z'`.
pub fn bytes_repr(bytes: &[u8]) -> String {
    let mut out = String::from("b'");
    for &b in bytes {
        match b {
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('\'');
    out
}

fn check_known(schema_version: u16, msg_type: u8) -> Result<(), HeaderError> {
    if !SUPPORTED_SCHEMA_VERSIONS.contains(&schema_version) {
        return Err(HeaderError::SchemaVersion(schema_version));
    }
    if !MSG_TYPES.contains(&msg_type) {
        return Err(HeaderError::MsgType(msg_type));
    }
    Ok(())
}

/// Converts a wide integer to a field's wire type, naming the field on failure.
pub fn field_value<T>(field: &'static str, value: i128) -> Result<T, HeaderError>
where
    T: TryFrom<i128> + WireType,
{
    T::try_from(value).map_err(|_| HeaderError::FieldRange {
        field,
        value: value.to_string(),
        wire_type: T::NAME,
        min: T::MIN,
        max: T::MAX,
    })
}

/// Name and range of a header field's wire type, for error messages.
pub trait WireType {
    /// Rust/wire name, e.g. `u16`.
    const NAME: &'static str;
    /// Smallest value.
    const MIN: i128;
    /// Largest value.
    const MAX: i128;
}

macro_rules! wire_type {
    ($($t:ty),*) => {$(
        impl WireType for $t {
            const NAME: &'static str = stringify!($t);
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        }
    )*};
}
wire_type!(u8, u16, u32, u64, i64);

impl Header {
    /// Encodes into the packed layout; rejects unknown schema versions and message types.
    pub fn encode(&self) -> Result<[u8; HEADER_SIZE], HeaderError> {
        check_known(self.schema_version, self.msg_type)?;
        let mut out = [0u8; HEADER_SIZE];
        out[0..2].copy_from_slice(&HEADER_MAGIC);
        out[2..4].copy_from_slice(&self.schema_version.to_le_bytes());
        out[4] = self.msg_type;
        out[5] = self.flags;
        out[6..14].copy_from_slice(&self.seq_id.to_le_bytes());
        out[14..18].copy_from_slice(&self.episode_id.to_le_bytes());
        out[18..22].copy_from_slice(&self.session_epoch.to_le_bytes());
        out[22..30].copy_from_slice(&self.client_mono_ns.to_le_bytes());
        out[30..46].copy_from_slice(&self.session_id);
        Ok(out)
    }

    /// Decodes the header of an attachment of exactly [`ATTACHMENT_SIZE`] bytes without
    /// checking its tag; checks length, magic, schema and message type, in that order.
    pub fn decode(attachment: &[u8]) -> Result<Self, HeaderError> {
        split_attachment(attachment)
            .ok_or(HeaderError::Length(attachment.len()))
            .and_then(|(header, _)| Self::from_bytes(header))
    }

    /// Decodes the packed header bytes; checks magic, schema and message type.
    pub fn from_bytes(buf: &[u8; HEADER_SIZE]) -> Result<Self, HeaderError> {
        let magic = [buf[0], buf[1]];
        if magic != HEADER_MAGIC {
            return Err(HeaderError::Magic(magic));
        }
        let header = Self {
            schema_version: u16::from_le_bytes([buf[2], buf[3]]),
            msg_type: buf[4],
            flags: buf[5],
            seq_id: u64::from_le_bytes(take(buf, 6)),
            episode_id: u32::from_le_bytes(take(buf, 14)),
            session_epoch: u32::from_le_bytes(take(buf, 18)),
            client_mono_ns: i64::from_le_bytes(take(buf, 22)),
            session_id: take(buf, 30),
        };
        check_known(header.schema_version, header.msg_type)?;
        Ok(header)
    }
}

/// Splits an attachment into its header and tag; None if it is not [`ATTACHMENT_SIZE`] bytes.
pub fn split_attachment(attachment: &[u8]) -> Option<(&[u8; HEADER_SIZE], &[u8; TAG_SIZE])> {
    let attachment: &[u8; ATTACHMENT_SIZE] = attachment.try_into().ok()?;
    let (header, tag) = attachment.split_at(HEADER_SIZE);
    Some((header.try_into().ok()?, tag.try_into().ok()?))
}

/// `N` bytes of `buf` from `at`; only called with in-bounds constant offsets.
fn take<const N: usize>(buf: &[u8; HEADER_SIZE], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Hand-computed from the layout table in the module docs.
    pub(crate) fn golden() -> [(Header, &'static str); 4] {
        [
            (
                Header {
                    schema_version: 3,
                    msg_type: MSG_OBS,
                    flags: FLAG_EPISODE_START,
                    seq_id: 42,
                    episode_id: 7,
                    session_epoch: 3,
                    client_mono_ns: 123_456_789,
                    session_id: [0; 16],
                },
                "5356 0300 01 01 2a00000000000000 07000000 03000000 15cd5b0700000000
                 00000000000000000000000000000000",
            ),
            (
                Header {
                    schema_version: 3,
                    msg_type: MSG_CHUNK,
                    flags: 0,
                    seq_id: 0x0102_0304_0506_0708,
                    episode_id: 0xdead_beef,
                    session_epoch: u32::MAX,
                    client_mono_ns: -2,
                    session_id: [0; 16],
                },
                "5356 0300 02 00 0807060504030201 efbeadde ffffffff feffffffffffffff
                 00000000000000000000000000000000",
            ),
            (
                Header {
                    schema_version: 3,
                    msg_type: MSG_CONTROL,
                    flags: 0,
                    seq_id: 1,
                    episode_id: 0,
                    session_epoch: 1,
                    client_mono_ns: 0,
                    session_id: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                },
                "5356 0300 05 00 0100000000000000 00000000 01000000 0000000000000000
                 000102030405060708090a0b0c0d0e0f",
            ),
            (
                Header {
                    schema_version: 3,
                    msg_type: MSG_CONTROL_ACK,
                    flags: 0x80,
                    seq_id: u64::MAX,
                    episode_id: 1,
                    session_epoch: 2,
                    client_mono_ns: i64::MIN,
                    session_id: [
                        0xc0, 0xff, 0xee, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x01, 0x23, 0x45, 0x67,
                        0x89, 0xab, 0xcd, 0xef,
                    ],
                },
                "5356 0300 06 80 ffffffffffffffff 01000000 02000000 0000000000000080
                 c0ffee00deadbeef0123456789abcdef",
            ),
        ]
    }

    /// The golden header bytes followed by an arbitrary tag (decoding ignores the tag).
    fn attachment(hex: &str) -> Vec<u8> {
        let mut bytes = unhex(hex);
        bytes.extend_from_slice(&[0xa5; TAG_SIZE]);
        bytes
    }

    #[test]
    fn golden_vectors() {
        for (header, hex) in golden() {
            let bytes = unhex(hex);
            assert_eq!(bytes.len(), HEADER_SIZE);
            assert_eq!(header.encode().unwrap().as_slice(), bytes.as_slice());
            assert_eq!(Header::decode(&attachment(hex)).unwrap(), header);
        }
    }

    #[test]
    fn decode_errors() {
        let good = attachment(golden()[0].1);
        assert_eq!(
            Header::decode(&good[..HEADER_SIZE])
                .unwrap_err()
                .to_string(),
            "attachment is 46 bytes, expected 62"
        );
        assert_eq!(
            Header::decode(&good[..30]).unwrap_err().to_string(),
            "attachment is 30 bytes, expected 62"
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(Header::decode(&long), Err(HeaderError::Length(63)));
        let mut bad = good.clone();
        bad[0..2].copy_from_slice(b"XX");
        assert_eq!(
            Header::decode(&bad).unwrap_err().to_string(),
            "bad magic b'XX', expected b'SV'"
        );
        bad[0..2].copy_from_slice(&[0, b'\'']);
        assert_eq!(
            Header::decode(&bad).unwrap_err().to_string(),
            "bad magic b'\\x00\\'', expected b'SV'"
        );
        let mut bad = good.clone();
        bad[2] = 1;
        assert_eq!(
            Header::decode(&bad).unwrap_err().to_string(),
            "unsupported schema_version 1 (supported: 3)"
        );
        let mut bad = good;
        bad[4] = 9;
        assert_eq!(
            Header::decode(&bad).unwrap_err().to_string(),
            "unknown msg_type 9 (known: 1, 2, 3, 4, 5, 6)"
        );
    }

    #[test]
    fn v2_headers_are_rejected() {
        // Schema 2 had this layout but bodies in the clear: its peers are refused by version.
        let mut v2 = attachment(golden()[0].1);
        v2[2] = 2;
        assert_eq!(
            Header::decode(&v2).unwrap_err().to_string(),
            "unsupported schema_version 2 (supported: 3)"
        );
    }

    #[test]
    fn v1_headers_are_rejected() {
        // A schema-1 header (30 bytes) padded to an attachment's size still names its version.
        let mut v1 = unhex("5356 0100 01 01 2a00000000000000 07000000 03000000 15cd5b0700000000");
        v1.resize(ATTACHMENT_SIZE, 0);
        assert_eq!(Header::decode(&v1), Err(HeaderError::SchemaVersion(1)));
    }

    #[test]
    fn encode_errors() {
        let mut header = golden()[0].0;
        header.msg_type = 0;
        assert_eq!(header.encode(), Err(HeaderError::MsgType(0)));
        header.msg_type = MSG_DRAIN;
        header.schema_version = 1;
        assert_eq!(header.encode(), Err(HeaderError::SchemaVersion(1)));
    }

    #[test]
    fn split() {
        let bytes: Vec<u8> = (0..ATTACHMENT_SIZE as u8).collect();
        let (header, tag) = split_attachment(&bytes).unwrap();
        assert_eq!(header.as_slice(), &bytes[..HEADER_SIZE]);
        assert_eq!(tag.as_slice(), &bytes[HEADER_SIZE..]);
        assert!(split_attachment(&bytes[1..]).is_none());
    }

    #[test]
    fn field_ranges() {
        assert_eq!(field_value::<u8>("flags", 255), Ok(255));
        assert_eq!(
            field_value::<u8>("flags", 256).unwrap_err().to_string(),
            "flags=256 does not fit u8, expected 0 <= flags <= 255"
        );
        assert!(field_value::<u64>("seq_id", -1).is_err());
        assert!(field_value::<u64>("seq_id", i128::from(u64::MAX)).is_ok());
        assert!(field_value::<i64>("client_mono_ns", i128::from(i64::MIN)).is_ok());
        assert!(field_value::<i64>("client_mono_ns", i128::from(i64::MAX) + 1).is_err());
    }

    pub(crate) fn any_header() -> impl Strategy<Value = Header> {
        (
            prop::sample::select(MSG_TYPES.to_vec()),
            any::<u8>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<i64>(),
            any::<[u8; SESSION_ID_SIZE]>(),
        )
            .prop_map(
                |(
                    msg_type,
                    flags,
                    seq_id,
                    episode_id,
                    session_epoch,
                    client_mono_ns,
                    session_id,
                )| {
                    Header {
                        schema_version: SCHEMA_VERSION,
                        msg_type,
                        flags,
                        seq_id,
                        episode_id,
                        session_epoch,
                        client_mono_ns,
                        session_id,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn round_trip(header in any_header(), tag in any::<[u8; TAG_SIZE]>()) {
            let bytes = header.encode().unwrap();
            prop_assert_eq!(&bytes[..2], b"SV");
            let mut attachment = bytes.to_vec();
            attachment.extend_from_slice(&tag);
            prop_assert_eq!(Header::decode(&attachment).unwrap(), header);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(header) = Header::decode(&bytes) {
                let encoded = header.encode().unwrap();
                prop_assert_eq!(encoded.as_slice(), &bytes[..HEADER_SIZE]);
            }
        }

        #[test]
        fn decode_never_panics_on_attachment_sized_input(
            bytes in any::<[u8; ATTACHMENT_SIZE]>(),
            magic in any::<bool>(),
        ) {
            // Random bytes almost never start with the magic; force it half the time so the
            // schema and message-type checks are reached.
            let mut bytes = bytes;
            if magic {
                bytes[..2].copy_from_slice(&HEADER_MAGIC);
                bytes[2..4].copy_from_slice(&SCHEMA_VERSION.to_le_bytes());
            }
            if let Ok(header) = Header::decode(&bytes) {
                let encoded = header.encode().unwrap();
                prop_assert_eq!(encoded.as_slice(), &bytes[..HEADER_SIZE]);
            }
        }
    }
}
