use super::*;
use crate::auth::AuthError;
use crate::header::tests::{any_header, golden, unhex};
use crate::header::{HeaderError, MSG_TYPES};
use proptest::prelude::*;

fn arr<const N: usize>(hex: &str) -> [u8; N] {
    unhex(hex).try_into().unwrap()
}

fn secret() -> [u8; KEY_SIZE] {
    core::array::from_fn(|i| i as u8 * 7)
}

/// Both ends of one session.
fn ends() -> (SessionKey, SessionKey) {
    (
        SessionKey::new(&secret(), Role::Client),
        SessionKey::new(&secret(), Role::Server),
    )
}

impl SessionKey {
    pub(crate) fn encrypt(
        &self,
        header: &Header,
        body: &[u8],
    ) -> Result<([u8; ATTACHMENT_SIZE], Vec<u8>), AuthError> {
        let mut out = body.to_vec();
        Ok((self.seal_in_place(header, &mut out)?, out))
    }

    pub(crate) fn decrypt(
        &self,
        attachment: &[u8],
        ciphertext: &[u8],
    ) -> Result<(Header, Vec<u8>), AuthError> {
        let mut out = ciphertext.to_vec();
        Ok((self.open_in_place(attachment, &mut out)?, out))
    }
}

fn header(msg_type: u8, seq_id: u64) -> Header {
    Header {
        msg_type,
        seq_id,
        ..golden()[0].0
    }
}

/// BLAKE3's official test vectors (test_vectors/test_vectors.json in the BLAKE3 repo):
/// input = 0, 1, ..., 250, 0, 1, ... of `input_len` bytes; the key is the ASCII string
/// below; `keyed_hash` is the first 32 bytes of each case's extended output.
const BLAKE3_KEY: &[u8; 32] = b"whats the Elvish word for friend";
const BLAKE3_KEYED: [(usize, &str); 7] = [
    (
        1023,
        "c951ecdf03288d0fcc96ee3413563d8a6d3589547f2c2fb36d9786470f1b9d6e",
    ),
    (
        1024,
        "75c46f6f3d9eb4f55ecaaee480db732e6c2105546f1e675003687c31719c7ba4",
    ),
    (
        1025,
        "357dc55de0c7e382c900fd6e320acc04146be01db6a8ce7210b7189bd664ea69",
    ),
    (
        2049,
        "9f29700902f7c86e514ddc4df1e3049f258b2472b6dd5267f61bf13983b78dd5",
    ),
    (
        4097,
        "00df940cd36bb9fa7cbbc3556744e0dbc8191401afe70520ba292ee3ca80abbc",
    ),
    (
        8193,
        "954a2a75420c8d6547e3ba5b98d963e6fa6491addc8c023189cc519821b4a1f5",
    ),
    (
        102400,
        "1c35d1a5811083fd7119f5d5d1ba027b4d01c0c6c49fb6ff2cf75393ea5db4a7",
    ),
];
fn blake3_input(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[test]
fn proof_tag_is_truncated_keyed_blake3() {
    for (len, hex) in BLAKE3_KEYED {
        let input = blake3_input(len);
        let header: &[u8; HEADER_SIZE] = input[..HEADER_SIZE].try_into().unwrap();
        let body = &input[HEADER_SIZE..];
        let expected = &unhex(hex)[..TAG_SIZE];
        assert_eq!(keyed_tag(BLAKE3_KEY, header, [body]).as_slice(), expected);
        // Any split of the data into parts gives the same tag.
        for cut in [0, 1, body.len() / 3, body.len() - 1, body.len()] {
            let (a, b) = body.split_at(cut);
            assert_eq!(keyed_tag(BLAKE3_KEY, header, [a, b]).as_slice(), expected);
            assert_eq!(
                keyed_tag(BLAKE3_KEY, header, [a, &[], b]).as_slice(),
                expected
            );
        }
    }
}

/// "The Galois/Counter Mode of Operation (GCM)" (McGrew and Viega), test case 16: AES-256
/// with associated data; also NIST's gcmEncryptExtIV256 vectors' format.
#[test]
fn aes_256_gcm_reference_vector() {
    let key = LessSafeKey::new(
        UnboundKey::new(
            &AES_256_GCM,
            &unhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"),
        )
        .unwrap(),
    );
    let mut text = unhex(
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72
         1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
    );
    let aad = unhex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
    let nonce = || Nonce::assume_unique_for_key(arr("cafebabefacedbaddecaf888"));
    let tag = key
        .seal_in_place_separate_tag(nonce(), Aad::from(&aad), &mut text)
        .unwrap();
    assert_eq!(
        text,
        unhex(
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa
             8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
        )
    );
    assert_eq!(tag.as_ref(), unhex("76fc6ece0f4e1768cddf8853bb2d551b"));
}

#[test]
fn golden_message() {
    // Pinned so a change of the construction cannot go unnoticed; cross-checked once with
    // Python's `cryptography` AESGCM: key = BLAKE3 derive_key(LANE_CONTEXTS[0], secret),
    // nonce = 01 000000 2a00000000000000, aad = the header.
    let (client, server) = ends();
    let header = header(MSG_OBS, 42);
    let (attachment, ciphertext) = client.encrypt(&header, b"servo").unwrap();
    assert_eq!(&attachment[..HEADER_SIZE], &header.encode().unwrap());
    assert_eq!(ciphertext, unhex("319ea061a6"));
    assert_eq!(
        attachment[HEADER_SIZE..],
        arr::<16>("84b7983515a65fc7e0d9a6921c0de4d7")
    );
    assert_eq!(
        server.decrypt(&attachment, &ciphertext),
        Ok((header, b"servo".to_vec()))
    );
}

#[test]
fn both_directions_round_trip() {
    let (client, server) = ends();
    for (sender, receiver) in [(&client, &server), (&server, &client)] {
        for (seq, msg_type) in sent_by(sender.role()).into_iter().enumerate() {
            let header = header(msg_type, seq as u64);
            let (attachment, out) = sender.encrypt(&header, b"body!!!").unwrap();
            assert_ne!(out, b"body!!!", "the body is encrypted");
            assert_eq!(
                receiver.decrypt(&attachment, &out),
                Ok((header, b"body!!!".to_vec()))
            );
        }
    }
}

fn sent_by(role: Role) -> Vec<u8> {
    MSG_TYPES
        .iter()
        .copied()
        .filter(|t| role.sends(*t))
        .collect()
}

#[test]
fn each_side_sends_its_own_types_only() {
    assert_eq!(sent_by(Role::Client), [MSG_OBS, MSG_CONTROL]);
    assert_eq!(
        sent_by(Role::Server),
        [MSG_CHUNK, MSG_ERROR, MSG_DRAIN, MSG_CONTROL_ACK]
    );
    let (client, server) = ends();
    assert_eq!(
        client
            .encrypt(&header(MSG_CHUNK, 1), b"x")
            .unwrap_err()
            .to_string(),
        "a client does not send msg_type 2"
    );
    assert_eq!(
        server.encrypt(&header(MSG_OBS, 1), b"x").unwrap_err(),
        AuthError::Direction {
            role: "server",
            msg_type: MSG_OBS
        }
    );
    // A message reflected back to its sender never verifies.
    let (attachment, body) = client.encrypt(&header(MSG_OBS, 1), b"x").unwrap();
    assert_eq!(
        client.decrypt(&attachment, &body),
        Err(AuthError::TagMismatch)
    );
    let proof = client
        .authenticate(&header(MSG_CONTROL, 1), [b"x".as_slice()])
        .unwrap();
    assert_eq!(
        client.verify(&proof, [b"x".as_slice()]),
        Err(AuthError::TagMismatch)
    );
    assert_eq!(
        server.verify(&proof, [b"x".as_slice()]),
        Ok(header(MSG_CONTROL, 1))
    );
}

#[test]
fn nonces_never_repeat_under_one_key() {
    let (client, _) = ends();
    client.encrypt(&header(MSG_OBS, 5), b"a").unwrap();
    for seq in [5, 4, 0] {
        assert_eq!(
            client.encrypt(&header(MSG_OBS, seq), b"b").unwrap_err(),
            AuthError::NonceReuse {
                msg_type: MSG_OBS,
                seq_id: seq
            }
        );
    }
    assert_eq!(
        client.encrypt(&header(MSG_OBS, 5), b"b").unwrap_err().to_string(),
        "seq_id 5 of msg_type 1 is not above the last one sent under this key (its nonce would repeat)"
    );
    // Another stream of the same side has its own nonces; seq 0 is usable once.
    client.encrypt(&header(MSG_CONTROL, 0), b"c").unwrap();
    client.encrypt(&header(MSG_CONTROL, 5), b"c").unwrap();
    client.encrypt(&header(MSG_OBS, 6), b"c").unwrap();
    assert!(client.encrypt(&header(MSG_OBS, u64::MAX), b"c").is_err());
    // A refused message burns nothing: the next seq still works.
    client.encrypt(&header(MSG_OBS, 7), b"c").unwrap();
}

#[test]
fn nonces_are_distinct_per_stream_and_seq() {
    let mut seen = std::collections::HashSet::new();
    for msg_type in MSG_TYPES {
        for seq in [0, 1, 255, 256, u64::MAX - 1] {
            assert!(seen.insert(nonce_bytes(msg_type, seq)));
        }
    }
    assert_eq!(
        nonce_bytes(MSG_CHUNK, 0x0102),
        arr("02000000 0201000000000000")
    );
}

#[test]
fn racing_senders_never_share_a_nonce() {
    let (_, server) = ends();
    let won: usize = std::thread::scope(|s| {
        let tries: Vec<_> = (0..8)
            .map(|_| s.spawn(|| server.encrypt(&header(MSG_CHUNK, 3), b"x").is_ok()))
            .collect();
        tries
            .into_iter()
            .map(|t| usize::from(t.join().unwrap()))
            .sum()
    });
    assert_eq!(won, 1);
}

#[test]
fn decrypt_errors() {
    let (client, server) = ends();
    let (attachment, body) = client.encrypt(&header(MSG_OBS, 1), b"body").unwrap();
    assert_eq!(
        server
            .decrypt(&attachment[1..], &body)
            .unwrap_err()
            .to_string(),
        "attachment is 61 bytes, expected 62"
    );
    assert_eq!(
        server
            .decrypt(&attachment, b"bodY")
            .unwrap_err()
            .to_string(),
        "tag mismatch"
    );
    let stranger = SessionKey::new(&[1; KEY_SIZE], Role::Server);
    assert_eq!(
        stranger.decrypt(&attachment, &body),
        Err(AuthError::TagMismatch)
    );
    let zero = crate::auth::unauthenticated(&header(MSG_OBS, 1)).unwrap();
    assert_eq!(
        server.decrypt(&zero, &body).unwrap_err().to_string(),
        "zero tag: the message is unauthenticated"
    );
    assert_eq!(
        server.verify(&zero, [b"x".as_slice()]),
        Err(AuthError::ZeroTag)
    );
}

#[test]
fn failed_decryption_leaves_no_plaintext() {
    let (client, server) = ends();
    let (mut attachment, body) = client.encrypt(&header(MSG_OBS, 1), &[0x5a; 64]).unwrap();
    attachment[ATTACHMENT_SIZE - 1] ^= 1;
    let mut out = body.clone();
    assert!(server.open_in_place(&attachment, &mut out).is_err());
    assert_eq!(out, [0; 64]);
}

#[test]
fn tag_is_checked_before_the_header() {
    // A key holder's tag over a bad header: only then is the header's error reported.
    let mut bad = header(MSG_CHUNK, 1).encode().unwrap();
    bad[0] = b'X';
    let lane = Lane::derive(&secret(), LANE_CONTEXTS[1], LANE_CONTEXTS[3]);
    let nonce = Nonce::assume_unique_for_key(nonce_bytes(MSG_CHUNK, 1));
    let mut body = *b"body";
    let tag = lane
        .aead
        .seal_in_place_separate_tag(nonce, Aad::from(&bad), &mut body)
        .unwrap();
    let client = SessionKey::new(&secret(), Role::Client);
    assert_eq!(
        client
            .decrypt(&attachment(&bad, tag.as_ref()), &body)
            .unwrap_err(),
        AuthError::Header(HeaderError::Magic(*b"XV"))
    );
    let forged = attachment(&bad, &[1; TAG_SIZE]);
    assert_eq!(client.decrypt(&forged, &body), Err(AuthError::TagMismatch));
}

fn message() -> impl Strategy<Value = (Header, Vec<u8>)> {
    (
        any_header().prop_filter("sent by a client", |h| Role::Client.sends(h.msg_type)),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
}

proptest! {
    #[test]
    fn round_trip((header, body) in message()) {
        let (client, server) = ends();
        let (attachment, out) = client.encrypt(&header, &body).unwrap();
        prop_assert_eq!(server.decrypt(&attachment, &out), Ok((header, body)));
        prop_assert_eq!(Header::decode(&attachment), Ok(header));
    }

    #[test]
    fn any_bit_flip_fails((header, body) in message(), bit in any::<prop::sample::Index>()) {
        let (client, server) = ends();
        let (attachment, ciphertext) = client.encrypt(&header, &body).unwrap();
        let (mut attachment, mut ciphertext) = (attachment.to_vec(), ciphertext);
        let bit = bit.index((attachment.len() + ciphertext.len()) * 8);
        let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
        if byte < attachment.len() {
            attachment[byte] ^= mask;
        } else {
            ciphertext[byte - attachment.len()] ^= mask;
        }
        let err = server.decrypt(&attachment, &ciphertext).unwrap_err();
        prop_assert!(matches!(err, AuthError::TagMismatch | AuthError::ZeroTag));
    }

    #[test]
    fn decrypt_never_panics(
        attachment in proptest::collection::vec(any::<u8>(), 0..80),
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let (_, server) = ends();
        let _ = server.decrypt(&attachment, &body);
        let _ = server.verify(&attachment, [body.as_slice()]);
    }
}
