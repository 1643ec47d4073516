"""servo._core authentication: per-message MAC, X25519 session keys, Ed25519 server identity."""

from __future__ import annotations

import contextlib
import os
import re
import threading

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

from servo._core import (
    ATTACHMENT_SIZE,
    HEADER_SIZE,
    KEY_SIZE,
    MSG_CHUNK,
    MSG_OBS,
    PUBLIC_KEY_SIZE,
    SCHEMA_VERSION,
    SEED_SIZE,
    SIGNATURE_SIZE,
    TAG_SIZE,
    AuthError,
    Header,
    HeaderError,
    KeyPair,
    ServerIdentity,
    SessionKey,
    decode_header,
    unauthenticated,
    verify_signature,
)

KEY_BYTES = bytes(range(100, 132))
SESSION = bytes(range(16))
HEADER = Header(SCHEMA_VERSION, MSG_OBS, 1, 42, 7, 3, 123_456_789, SESSION)
BODY = bytes(range(256)) * 4


@pytest.fixture
def key() -> SessionKey:
    return SessionKey(KEY_BYTES)


def test_constants() -> None:
    assert (KEY_SIZE, PUBLIC_KEY_SIZE, SEED_SIZE, SIGNATURE_SIZE) == (32, 32, 32, 64)
    assert issubclass(AuthError, ValueError)
    assert not issubclass(AuthError, HeaderError)


# ------------------------------------------------------------------------------ seal / open


def test_round_trip(key: SessionKey) -> None:
    attachment = key.seal(HEADER, BODY)
    assert len(attachment) == ATTACHMENT_SIZE
    assert attachment[:HEADER_SIZE] == unauthenticated(HEADER)[:HEADER_SIZE]
    assert attachment[HEADER_SIZE:] != bytes(TAG_SIZE)
    assert key.open(attachment, BODY) == HEADER
    assert decode_header(attachment) == HEADER
    assert key.seal(HEADER, BODY) == attachment  # deterministic


@pytest.mark.parametrize(
    "body",
    [
        BODY,
        bytearray(BODY),
        memoryview(BODY),
        memoryview(b"xx" + BODY)[2:],
        np.frombuffer(BODY, np.float32).reshape(16, 16),
        [BODY],
        [BODY[:1], BODY[1:100], b"", BODY[100:]],
        (memoryview(BODY)[:500], bytearray(BODY[500:])),
        [np.frombuffer(BODY[:512], np.uint16), BODY[512:]],
    ],
    ids=["bytes", "bytearray", "memoryview", "offset-view", "float32", "list1", "parts", "tuple", "ndarray-part"],
)
def test_every_body_form_gives_the_same_tag(key: SessionKey, body: object) -> None:
    expected = key.seal(HEADER, BODY)
    assert key.seal(HEADER, body) == expected  # type: ignore[arg-type]
    assert key.open(expected, body) == HEADER  # type: ignore[arg-type]


def test_empty_body(key: SessionKey) -> None:
    attachment = key.seal(HEADER, b"")
    assert key.open(attachment, []) == HEADER
    assert key.open(attachment, [b"", b""]) == HEADER
    with pytest.raises(AuthError, match=r"^tag mismatch$"):
        key.open(attachment, b"\x00")


def test_every_bit_of_header_tag_and_body_is_covered(key: SessionKey) -> None:
    body = BODY[:64]
    attachment = key.seal(HEADER, body)
    for byte in range(ATTACHMENT_SIZE):
        for bit in range(8):
            tampered = bytearray(attachment)
            tampered[byte] ^= 1 << bit
            with pytest.raises(AuthError, match=r"^tag mismatch$"):
                key.open(tampered, body)
    for byte in range(len(body)):
        for bit in range(8):
            tampered = bytearray(body)
            tampered[byte] ^= 1 << bit
            with pytest.raises(AuthError, match=r"^tag mismatch$"):
                key.open(attachment, tampered)


def test_moving_bytes_between_parts_and_message_boundaries(key: SessionKey) -> None:
    attachment = key.seal(HEADER, [b"ab", b"cd"])
    assert key.open(attachment, [b"a", b"bcd"]) == HEADER  # parts are a pure split
    for body in (b"abc", b"abcde", b"abdc", b""):
        with pytest.raises(AuthError, match="tag mismatch"):
            key.open(attachment, body)


def test_wrong_key_is_refused(key: SessionKey) -> None:
    attachment = key.seal(HEADER, BODY)
    for other in (bytes(32), KEY_BYTES[:-1] + b"\x00", KEY_BYTES[::-1]):
        with pytest.raises(AuthError, match=r"^tag mismatch$"):
            SessionKey(other).open(attachment, BODY)


def test_a_tag_does_not_move_to_another_message_type(key: SessionKey) -> None:
    attachment = key.seal(HEADER, BODY)
    as_chunk = unauthenticated(HEADER.replace(msg_type=MSG_CHUNK))[:HEADER_SIZE] + attachment[HEADER_SIZE:]
    with pytest.raises(AuthError, match="tag mismatch"):
        key.open(as_chunk, BODY)


@pytest.mark.parametrize("size", [0, 1, HEADER_SIZE, ATTACHMENT_SIZE - 1, ATTACHMENT_SIZE + 1, 1000])
def test_wrong_attachment_length(key: SessionKey, size: int) -> None:
    attachment = (key.seal(HEADER, BODY) * 20)[:size]
    with pytest.raises(AuthError, match=rf"^attachment is {size} bytes, expected 62$"):
        key.open(attachment, BODY)


def test_zero_tag_is_always_refused(key: SessionKey) -> None:
    notice = unauthenticated(HEADER)
    assert notice[HEADER_SIZE:] == bytes(TAG_SIZE)
    assert decode_header(notice) == HEADER
    for k in (key, SessionKey(bytes(32))):
        with pytest.raises(AuthError, match=r"^zero tag: the message is unauthenticated$"):
            k.open(notice, BODY)


def test_bad_header_is_refused_by_the_tag_first(key: SessionKey) -> None:
    # Without the key nobody can tag a header: a garbage header is a tag mismatch, not a
    # HeaderError, so nothing is parsed before the tag verifies.
    attachment = bytearray(key.seal(HEADER, BODY))
    attachment[0:2] = b"XX"
    with pytest.raises(AuthError, match="tag mismatch"):
        key.open(attachment, BODY)


def test_seal_validates_the_header(key: SessionKey) -> None:
    with pytest.raises(HeaderError, match="unknown msg_type 9"):
        key.seal(HEADER.replace(msg_type=9), BODY)
    with pytest.raises(HeaderError, match=r"unsupported schema_version 1 \(supported: 2\)"):
        key.seal(HEADER.replace(schema_version=1), BODY)


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), bytes(64)])
def test_key_must_be_32_bytes(bad: bytes) -> None:
    with pytest.raises(AuthError, match=rf"^key is {len(bad)} bytes, expected 32$"):
        SessionKey(bad)


def test_non_buffers_are_type_errors(key: SessionKey) -> None:
    with pytest.raises(TypeError):
        SessionKey("k" * 32)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        key.seal(HEADER, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        key.seal(HEADER, [b"ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        key.open(None, BODY)  # type: ignore[arg-type]


def test_non_contiguous_buffers_are_refused(key: SessionKey) -> None:
    strided = np.arange(64, dtype=np.uint8)[::2]
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        key.seal(HEADER, strided)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        key.seal(HEADER, memoryview(BODY)[::2])


def test_buffer_exports_are_released(key: SessionKey) -> None:
    """A bytearray cannot be resized while exported: every path must release its export."""
    part = bytearray(b"abc")
    key.open(key.seal(HEADER, part), part)
    with pytest.raises(TypeError):
        key.seal(HEADER, [part, 3])  # type: ignore[list-item]
    with pytest.raises(AuthError):
        key.open(bytes(ATTACHMENT_SIZE - 1), part)
    with pytest.raises(AuthError):
        key.open(bytearray(key.seal(HEADER, b"x")), part)
    part.extend(b"def")  # raises BufferError if an export leaked
    assert part == b"abcdef"


ATTACHMENTS = st.one_of(
    st.binary(max_size=80),
    # Attachment-sized, with a valid magic and schema, so decoding would get past the first checks.
    st.binary(min_size=ATTACHMENT_SIZE - 4, max_size=ATTACHMENT_SIZE - 4).map(lambda b: b"SV\x02\x00" + b),
)


@given(attachment=ATTACHMENTS, body=st.binary(max_size=64))
def test_open_arbitrary_bytes_is_an_auth_error(attachment: bytes, body: bytes) -> None:
    with pytest.raises(AuthError):  # no tag can be right: the key is not the attacker's
        SessionKey(KEY_BYTES).open(attachment, body)


@given(
    flips=st.lists(st.tuples(st.integers(0, ATTACHMENT_SIZE - 1), st.integers(1, 255)), min_size=1, max_size=4),
    body=st.binary(max_size=64),
)
def test_open_mutated_attachments_is_refused(flips: list[tuple[int, int]], body: bytes) -> None:
    key = SessionKey(KEY_BYTES)
    attachment = bytearray(key.seal(HEADER, body))
    for index, mask in flips:
        attachment[index] ^= mask
    if attachment == key.seal(HEADER, body):
        return  # the flips cancelled out
    with pytest.raises(AuthError):
        key.open(bytes(attachment), body)
    with contextlib.suppress(HeaderError):
        decode_header(bytes(attachment))


def test_gil_is_released_while_hashing_a_big_body(key: SessionKey) -> None:
    """Another thread runs *inside* seal calls of a big body.

    While seal holds the body's buffer export, a bytearray refuses to be resized
    (BufferError). The spinner only sees that refusal if it runs during a call, which it can
    only do if the call released the GIL.
    """
    inside = _resizes_refused(key, 32 * 2**20, calls=5)
    assert inside > 0


def test_gil_is_kept_for_a_small_body(key: SessionKey) -> None:
    assert _resizes_refused(key, 4 * 2**10, calls=2_000) == 0


def _resizes_refused(key: SessionKey, size: int, *, calls: int) -> int:
    body = bytearray(size)
    refused = [0]
    running = threading.Event()
    stop = threading.Event()

    def spin() -> None:
        running.set()
        while not stop.is_set():
            try:
                body.append(0)
                body.pop()
            except BufferError:
                refused[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    assert running.wait(5)
    try:
        for _ in range(calls):
            key.seal(HEADER, body)
    finally:
        stop.set()
        thread.join()
    return refused[0]


def test_repr_hides_the_key(key: SessionKey) -> None:
    text = repr(key)
    assert text == "SessionKey(<secret>)"
    assert KEY_BYTES.hex() not in text
    assert repr(KEY_BYTES) not in text


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_seal_open_keeps_rss_bounded(key: SessionKey) -> None:
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    body = [BODY, bytearray(BODY)]
    for _ in range(1_000):
        key.open(key.seal(HEADER, body), body)
    before = rss()
    for i in range(10_000):
        header = HEADER.replace(seq_id=i)
        key.open(key.seal(header, body), body)
        with pytest.raises(AuthError):
            key.open(unauthenticated(header), body)
    assert rss() - before < 8 * 2**20


# ------------------------------------------------------------------------------ key exchange


def exchange(session_id: bytes = SESSION) -> tuple[SessionKey, SessionKey]:
    client, server = KeyPair(), KeyPair()
    roles = {"client_public": client.public_key, "server_public": server.public_key, "session_id": session_id}
    return client.session_key(server.public_key, **roles), server.session_key(client.public_key, **roles)


def test_both_sides_derive_the_same_key() -> None:
    client_key, server_key = exchange()
    observation = client_key.seal(HEADER, BODY)
    assert server_key.open(observation, BODY) == HEADER
    chunk_header = HEADER.replace(msg_type=MSG_CHUNK)
    assert client_key.open(server_key.seal(chunk_header, b"chunk"), b"chunk") == chunk_header


def test_each_exchange_and_session_id_gives_another_key() -> None:
    client_key, _ = exchange(SESSION)
    _, other_server_key = exchange(SESSION)
    attachment = client_key.seal(HEADER, BODY)
    with pytest.raises(AuthError, match="tag mismatch"):
        other_server_key.open(attachment, BODY)
    # Same key pairs, another session id: another key.
    client, server = KeyPair(), KeyPair()
    a = client.session_key(
        server.public_key, client_public=client.public_key, server_public=server.public_key, session_id=SESSION
    )
    b = server.session_key(
        client.public_key, client_public=client.public_key, server_public=server.public_key, session_id=bytes(16)
    )
    with pytest.raises(AuthError, match="tag mismatch"):
        b.open(a.seal(HEADER, BODY), BODY)


def test_public_keys_are_fresh() -> None:
    keys = {KeyPair().public_key for _ in range(50)}
    assert len(keys) == 50
    assert all(len(k) == PUBLIC_KEY_SIZE for k in keys)


def test_a_key_pair_is_single_use() -> None:
    client, server = KeyPair(), KeyPair()
    roles = {"client_public": client.public_key, "server_public": server.public_key, "session_id": SESSION}
    client.session_key(server.public_key, **roles)
    with pytest.raises(AuthError, match="already used"):
        client.session_key(server.public_key, **roles)
    assert len(client.public_key) == PUBLIC_KEY_SIZE  # still readable


def test_roles_must_be_the_two_key_pairs() -> None:
    client, server, stranger = KeyPair(), KeyPair(), KeyPair()
    c, s = client.public_key, server.public_key
    with pytest.raises(AuthError, match=r"^client_public and server_public are the same key$"):
        client.session_key(s, client_public=c, server_public=c, session_id=SESSION)
    with pytest.raises(AuthError, match=r"^this key pair's public key is neither client_public nor server_public$"):
        client.session_key(s, client_public=stranger.public_key, server_public=s, session_id=SESSION)
    with pytest.raises(AuthError, match=r"^peer_public is not the other party's public key$"):
        client.session_key(stranger.public_key, client_public=c, server_public=s, session_id=SESSION)
    # Refused before the secret was used: the pair still works.
    client.session_key(s, client_public=c, server_public=s, session_id=SESSION)


# Points of order 1, 2, 4 and 8 on Curve25519 (u-coordinates), including non-canonical
# encodings: X25519 with any of them gives the all-zero shared secret.
LOW_ORDER = [
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
    "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
]


@pytest.mark.parametrize("point", LOW_ORDER)
def test_low_order_peer_keys_are_refused(point: str) -> None:
    server = KeyPair()
    peer = bytes.fromhex(point)
    with pytest.raises(AuthError, match=re.escape("peer public key is of low order (all-zero shared secret)")):
        server.session_key(peer, client_public=peer, server_public=server.public_key, session_id=SESSION)


@pytest.mark.parametrize(
    ("field", "size", "expected"),
    [
        ("peer_public", 31, 32),
        ("client_public", 33, 32),
        ("server_public", 0, 32),
        ("session_id", 15, 16),
        ("session_id", 32, 16),
    ],
)
def test_exchange_lengths_are_checked(field: str, size: int, expected: int) -> None:
    client, server = KeyPair(), KeyPair()
    args = {
        "peer_public": server.public_key,
        "client_public": client.public_key,
        "server_public": server.public_key,
        "session_id": SESSION,
    }
    args[field] = bytes(size)
    peer = args.pop("peer_public")
    with pytest.raises(AuthError, match=rf"^{field} is {size} bytes, expected {expected}$"):
        client.session_key(peer, **args)


def test_key_pair_repr_shows_only_the_public_key() -> None:
    pair = KeyPair()
    assert repr(pair) == f"KeyPair(public_key=bytes.fromhex('{pair.public_key.hex()}'))"


# ------------------------------------------------------------------------------ server identity

# RFC 8032 section 7.1, TEST 1 and TEST 2.
RFC8032 = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        b"",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        b"\x72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
]


@pytest.mark.parametrize(("seed", "public", "message", "signature"), RFC8032)
def test_rfc8032_vectors(seed: str, public: str, message: bytes, signature: str) -> None:
    identity = ServerIdentity.from_seed(bytes.fromhex(seed))
    assert identity.public_key == bytes.fromhex(public)
    assert identity.seed == bytes.fromhex(seed)
    assert identity.sign(message) == bytes.fromhex(signature)
    assert verify_signature(bytes.fromhex(public), message, bytes.fromhex(signature))


def test_sign_and_verify_match_an_independent_implementation() -> None:
    identity = ServerIdentity.generate()
    theirs = Ed25519PrivateKey.from_private_bytes(identity.seed)
    message = b"status: replica-0 load=0.25"
    assert identity.sign(message) == theirs.sign(message)  # Ed25519 signatures are deterministic
    Ed25519PublicKey.from_public_bytes(identity.public_key).verify(identity.sign(message), message)
    assert verify_signature(identity.public_key, message, theirs.sign(message))


def test_identity_round_trips_through_its_seed() -> None:
    identity = ServerIdentity.generate()
    assert len(identity.seed) == SEED_SIZE
    assert len(identity.public_key) == PUBLIC_KEY_SIZE
    again = ServerIdentity.from_seed(identity.seed)
    assert again.public_key == identity.public_key
    assert ServerIdentity.generate().public_key != identity.public_key


def test_verify_refuses_changed_messages_signatures_and_signers() -> None:
    identity, other = ServerIdentity.generate(), ServerIdentity.generate()
    message = bytearray(b"replica-0 is trusted")
    signature = identity.sign(message)
    assert len(signature) == SIGNATURE_SIZE
    assert verify_signature(identity.public_key, message, signature)
    assert verify_signature(identity.public_key, memoryview(bytes(message)), signature)
    assert not verify_signature(other.public_key, message, signature)
    for i in range(len(message)):
        changed = bytearray(message)
        changed[i] ^= 1
        assert not verify_signature(identity.public_key, changed, signature)
    for i in range(SIGNATURE_SIZE):
        changed = bytearray(signature)
        changed[i] ^= 0x40
        assert not verify_signature(identity.public_key, message, bytes(changed))


@pytest.mark.parametrize(
    ("public_key", "signature", "message"),
    [
        (bytes(31), bytes(64), "public_key is 31 bytes, expected 32"),
        (bytes(32), bytes(63), "signature is 63 bytes, expected 64"),
        (bytes(33), bytes(65), "public_key is 33 bytes, expected 32"),
    ],
)
def test_verify_lengths_are_checked(public_key: bytes, signature: bytes, message: str) -> None:
    with pytest.raises(AuthError, match=f"^{message}$"):
        verify_signature(public_key, b"m", signature)


@given(
    public_key=st.binary(min_size=32, max_size=32),
    message=st.binary(max_size=64),
    sig=st.binary(min_size=64, max_size=64),
)
def test_verify_garbage_is_false_never_an_error(public_key: bytes, message: bytes, sig: bytes) -> None:
    assert verify_signature(public_key, message, sig) is False


@pytest.mark.parametrize("size", [0, 31, 33])
def test_seed_must_be_32_bytes(size: int) -> None:
    with pytest.raises(AuthError, match=rf"^seed is {size} bytes, expected 32$"):
        ServerIdentity.from_seed(bytes(size))


def test_identity_repr_hides_the_seed() -> None:
    seed = bytes.fromhex(RFC8032[0][0])
    identity = ServerIdentity.from_seed(seed)
    text = repr(identity)
    assert text == f"ServerIdentity(public_key=bytes.fromhex('{RFC8032[0][1]}'))"
    assert seed.hex() not in text
    assert repr(seed) not in text
