"""servo._core's session cipher: AES-256-GCM per direction, header as associated data, nonce guard."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servo._core import (
    ATTACHMENT_SIZE,
    FLAG_COPY,
    HEADER_SIZE,
    MSG_CHUNK,
    MSG_CONTROL,
    MSG_CONTROL_ACK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    SCHEMA_VERSION,
    TAG_SIZE,
    AuthError,
    Header,
    HeaderError,
    SessionKey,
    decode_header,
    unauthenticated,
)

SECRET = bytes(range(100, 132))
SESSION = bytes(range(16))
HEADER = Header(SCHEMA_VERSION, MSG_OBS, 1, 42, 7, 3, 123_456_789, SESSION)
BODY = bytes(range(256)) * 4


def ends(secret: bytes = SECRET) -> tuple[SessionKey, SessionKey]:
    """Both ends of one session."""
    return SessionKey(secret, role="client"), SessionKey(secret, role="server")


def obs(seq_id: int) -> Header:
    return HEADER.replace(seq_id=seq_id)


# ------------------------------------------------------------------------------ encrypt / decrypt


def test_round_trip_both_ways() -> None:
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, BODY)
    assert len(attachment) == ATTACHMENT_SIZE
    assert attachment[:HEADER_SIZE] == unauthenticated(HEADER)[:HEADER_SIZE]
    assert attachment[HEADER_SIZE:] != bytes(TAG_SIZE)
    assert len(ciphertext) == len(BODY)
    assert server.decrypt(attachment, ciphertext) == (HEADER, BODY)
    assert decode_header(attachment) == HEADER
    for msg_type in (MSG_CHUNK, MSG_ERROR, MSG_DRAIN, MSG_CONTROL_ACK):
        reply = HEADER.replace(msg_type=msg_type)
        assert client.decrypt(*server.encrypt(reply, b"answer")) == (reply, b"answer")


def test_golden_message() -> None:
    """The Rust core's pinned vector (rust/cipher/tests.rs), cross-checked with OpenSSL's AES-GCM."""
    client, server = ends(bytes(i * 7 % 256 for i in range(32)))
    header = Header(SCHEMA_VERSION, MSG_OBS, 1, 42, 7, 3, 123_456_789, bytes(16))
    attachment, ciphertext = client.encrypt(header, b"servo")
    assert ciphertext.hex() == "319ea061a6"
    assert attachment[HEADER_SIZE:].hex() == "84b7983515a65fc7e0d9a6921c0de4d7"
    assert server.decrypt(attachment, ciphertext) == (header, b"servo")


def test_nothing_of_the_body_is_readable() -> None:
    client, _ = ends()
    body = b"kitchen camera frame " * 500
    attachment, ciphertext = client.encrypt(HEADER, body)
    assert b"kitchen" not in ciphertext
    assert b"kitchen" not in attachment
    # The same body under the next seq_id encrypts to unrelated bytes (fresh nonce).
    _, again = client.encrypt(obs(43), body)
    assert sum(a == b for a, b in zip(ciphertext, again, strict=True)) < len(body) // 64


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
def test_every_body_form_encrypts_the_same(body: object) -> None:
    expected = ends()[0].encrypt(HEADER, BODY)
    client, server = ends()
    assert client.encrypt(HEADER, body) == expected  # type: ignore[arg-type]
    assert server.decrypt(expected[0], memoryview(expected[1])) == (HEADER, BODY)


def test_empty_body() -> None:
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, b"")
    assert ciphertext == b""
    assert server.decrypt(attachment, b"") == (HEADER, b"")
    with pytest.raises(AuthError, match=r"^tag mismatch$"):
        server.decrypt(attachment, b"\x00")


def test_every_bit_of_header_tag_and_ciphertext_is_covered() -> None:
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, BODY[:64])
    for byte in range(ATTACHMENT_SIZE):
        for bit in range(8):
            tampered = bytearray(attachment)
            tampered[byte] ^= 1 << bit
            with pytest.raises(AuthError, match=r"^tag mismatch$"):
                server.decrypt(tampered, ciphertext)
    for byte in range(len(ciphertext)):
        for bit in range(8):
            tampered = bytearray(ciphertext)
            tampered[byte] ^= 1 << bit
            with pytest.raises(AuthError, match=r"^tag mismatch$"):
                server.decrypt(attachment, tampered)


def test_the_copy_flag_is_authenticated() -> None:
    """A relay can neither make an observation a copy (answered from an older answer) nor a copy a new request."""
    client, server = ends()
    plain, copy = obs(2).replace(flags=0), obs(3).replace(flags=FLAG_COPY)
    for sent, forged in ((plain, plain.replace(flags=FLAG_COPY)), (copy, copy.replace(flags=0))):
        attachment, ciphertext = client.encrypt(sent, BODY)
        tampered = unauthenticated(forged)[:HEADER_SIZE] + attachment[HEADER_SIZE:]
        with pytest.raises(AuthError, match=r"^tag mismatch$"):
            server.decrypt(tampered, ciphertext)
        assert server.decrypt(attachment, ciphertext) == (sent, BODY)


def test_wrong_secret_is_refused() -> None:
    client, _ = ends()
    sealed = client.encrypt(HEADER, BODY)
    for other in (bytes(32), SECRET[:-1] + b"\x00", SECRET[::-1]):
        with pytest.raises(AuthError, match=r"^tag mismatch$"):
            SessionKey(other, role="server").decrypt(*sealed)


def test_each_end_sends_its_own_message_types() -> None:
    client, server = ends()
    for msg_type in (MSG_CHUNK, MSG_ERROR, MSG_DRAIN, MSG_CONTROL_ACK):
        with pytest.raises(AuthError, match=rf"^a client does not send msg_type {msg_type}$"):
            client.encrypt(HEADER.replace(msg_type=msg_type), b"x")
    for msg_type in (MSG_OBS, MSG_CONTROL):
        with pytest.raises(AuthError, match=rf"^a server does not send msg_type {msg_type}$"):
            server.encrypt(HEADER.replace(msg_type=msg_type), b"x")


def test_a_message_reflected_to_its_sender_never_verifies() -> None:
    client, server = ends()
    with pytest.raises(AuthError, match="tag mismatch"):
        client.decrypt(*client.encrypt(HEADER, BODY))
    chunk = HEADER.replace(msg_type=MSG_CHUNK)
    with pytest.raises(AuthError, match="tag mismatch"):
        server.decrypt(*server.encrypt(chunk, BODY))


def test_a_tag_does_not_move_to_another_message_type() -> None:
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, BODY)
    as_control = unauthenticated(HEADER.replace(msg_type=MSG_CONTROL))[:HEADER_SIZE] + attachment[HEADER_SIZE:]
    with pytest.raises(AuthError, match="tag mismatch"):
        server.decrypt(as_control, ciphertext)


def test_a_nonce_never_repeats_under_one_key() -> None:
    client, server = ends()
    client.encrypt(obs(5), b"a")
    for seq_id in (5, 4, 0):
        with pytest.raises(AuthError, match=rf"^seq_id {seq_id} of msg_type 1 is not above the last one sent"):
            client.encrypt(obs(seq_id), b"b")
    # Each message type has its own stream; the refusal burned nothing.
    control = HEADER.replace(msg_type=MSG_CONTROL, seq_id=1)
    assert server.decrypt(*client.encrypt(control, b"c")) == (control, b"c")
    assert server.decrypt(*client.encrypt(obs(6), b"d")) == (obs(6), b"d")
    with pytest.raises(AuthError, match="nonce would repeat"):
        client.encrypt(obs(2**64 - 1), b"e")


def test_racing_threads_never_share_a_nonce() -> None:
    client, _ = ends()
    won: list[bool] = []
    barrier = threading.Barrier(8)

    def attempt() -> None:
        barrier.wait()
        try:
            client.encrypt(obs(9), BODY)
            won.append(True)
        except AuthError:
            won.append(False)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False] * 7 + [True]


@pytest.mark.parametrize("size", [0, 1, HEADER_SIZE, ATTACHMENT_SIZE - 1, ATTACHMENT_SIZE + 1, 1000])
def test_wrong_attachment_length(size: int) -> None:
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, BODY)
    with pytest.raises(AuthError, match=rf"^attachment is {size} bytes, expected 62$"):
        server.decrypt((attachment * 20)[:size], ciphertext)


def test_zero_tag_is_always_refused() -> None:
    notice = unauthenticated(HEADER)
    assert notice[HEADER_SIZE:] == bytes(TAG_SIZE)
    assert decode_header(notice) == HEADER
    for key in (*ends(), SessionKey(bytes(32), role="server")):
        with pytest.raises(AuthError, match=r"^zero tag: the message is unauthenticated$"):
            key.decrypt(notice, BODY)
        with pytest.raises(AuthError, match=r"^zero tag: the message is unauthenticated$"):
            key.verify(notice, BODY)


def test_bad_header_is_refused_by_the_tag_first() -> None:
    # Without the key nobody can tag a header: a garbage header is a tag mismatch, not a
    # HeaderError, so nothing is parsed before the tag verifies.
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, BODY)
    forged = bytearray(attachment)
    forged[0:2] = b"XX"
    with pytest.raises(AuthError, match="tag mismatch"):
        server.decrypt(forged, ciphertext)


def test_encrypt_validates_the_header() -> None:
    client, _ = ends()
    with pytest.raises(HeaderError, match="unknown msg_type 9"):
        client.encrypt(HEADER.replace(msg_type=9), BODY)
    with pytest.raises(HeaderError, match=r"unsupported schema_version 2 \(supported: 3\)"):
        client.encrypt(HEADER.replace(schema_version=2), BODY)


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), bytes(64)])
def test_secret_must_be_32_bytes(bad: bytes) -> None:
    with pytest.raises(AuthError, match=rf"^secret is {len(bad)} bytes, expected 32$"):
        SessionKey(bad, role="client")


def test_role_must_be_client_or_server() -> None:
    with pytest.raises(ValueError, match=r"""^role "robot" is not 'client' or 'server'$"""):
        SessionKey(SECRET, role="robot")  # type: ignore[arg-type]


def test_non_buffers_are_type_errors() -> None:
    client, server = ends()
    with pytest.raises(TypeError):
        SessionKey("k" * 32, role="client")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.encrypt(HEADER, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.encrypt(HEADER, [b"ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        server.decrypt(None, BODY)  # type: ignore[arg-type]


def test_non_contiguous_buffers_are_refused() -> None:
    client, _ = ends()
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        client.encrypt(HEADER, np.arange(64, dtype=np.uint8)[::2])
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        client.encrypt(HEADER, memoryview(BODY)[::2])


def test_buffer_exports_are_released() -> None:
    """A bytearray cannot be resized while exported: every path must release its export."""
    client, server = ends()
    part = bytearray(b"abc")
    attachment, ciphertext = client.encrypt(HEADER, part)
    sealed = bytearray(ciphertext)
    server.decrypt(attachment, sealed)
    with pytest.raises(TypeError):
        client.encrypt(obs(50), [part, 3])  # type: ignore[list-item]
    with pytest.raises(AuthError):
        server.decrypt(bytes(ATTACHMENT_SIZE - 1), sealed)
    with pytest.raises(AuthError):
        server.decrypt(bytearray(attachment), part)
    part.extend(b"def")  # raises BufferError if an export leaked
    sealed.extend(b"def")
    assert part == b"abcdef"


ATTACHMENTS = st.one_of(
    st.binary(max_size=80),
    # Attachment-sized, with a valid magic and schema, so decoding would get past the first checks.
    st.binary(min_size=ATTACHMENT_SIZE - 4, max_size=ATTACHMENT_SIZE - 4).map(lambda b: b"SV\x03\x00" + b),
)


@given(attachment=ATTACHMENTS, body=st.binary(max_size=64))
def test_decrypting_arbitrary_bytes_is_an_auth_error(attachment: bytes, body: bytes) -> None:
    server = SessionKey(SECRET, role="server")
    with pytest.raises(AuthError):  # no tag can be right: the key is not the attacker's
        server.decrypt(attachment, body)
    with pytest.raises(AuthError):
        server.verify(attachment, body)


@given(
    flips=st.lists(st.tuples(st.integers(0, ATTACHMENT_SIZE - 1), st.integers(1, 255)), min_size=1, max_size=4),
    body=st.binary(max_size=64),
)
def test_mutated_attachments_are_refused(flips: list[tuple[int, int]], body: bytes) -> None:
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, body)
    tampered = bytearray(attachment)
    for index, mask in flips:
        tampered[index] ^= mask
    if tampered == attachment:
        return  # the flips cancelled out
    with pytest.raises(AuthError):
        server.decrypt(bytes(tampered), ciphertext)
    with contextlib.suppress(HeaderError):
        decode_header(bytes(tampered))


# ------------------------------------------------------------------------------ proofs


def test_proofs_bind_the_data_and_the_direction() -> None:
    client, server = ends()
    control = HEADER.replace(msg_type=MSG_CONTROL)
    proof = client.authenticate(control, [b"new ", b"key"])
    assert len(proof) == ATTACHMENT_SIZE
    assert server.verify(proof, b"new key") == control
    with pytest.raises(AuthError, match=r"^tag mismatch$"):
        server.verify(proof, b"new kez")
    with pytest.raises(AuthError, match=r"^tag mismatch$"):
        client.verify(proof, b"new key")  # a proof does not verify for its own sender
    with pytest.raises(AuthError, match="does not send"):
        server.authenticate(control, b"x")
    # Proofs use no nonce: making one leaves the control stream's nonces to the messages.
    assert server.decrypt(*client.encrypt(control, b"reset")) == (control, b"reset")
