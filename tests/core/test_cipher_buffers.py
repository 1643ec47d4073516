"""servo._core's session cipher with real buffers: in place, out of Zenoh, the GIL, memory."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from servo._core import AuthError, unauthenticated
from tests.core.test_cipher import BODY, HEADER, SECRET, ends, obs

# ------------------------------------------------------------------------------ GIL and memory


def test_gil_is_released_while_encrypting_a_big_body() -> None:
    """Another thread runs *inside* encrypt and decrypt calls of a big body.

    While a call holds the body's buffer export, a bytearray refuses to be resized
    (BufferError). The spinner only sees that refusal if it runs during a call, which it can
    only do if the call released the GIL.
    """
    assert _resizes_refused(32 * 2**20, calls=5) > 0


def test_gil_is_kept_for_a_small_body() -> None:
    assert _resizes_refused(4 * 2**10, calls=2_000) == 0


def _resizes_refused(size: int, *, calls: int) -> int:
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

    client, server = ends()
    thread = threading.Thread(target=spin)
    thread.start()
    assert running.wait(5)
    try:
        for seq_id in range(1, calls + 1):
            attachment, _ = client.encrypt(obs(seq_id), body)
            with contextlib.suppress(AuthError):
                server.decrypt(attachment, body)  # the spinner's bytearray, as ciphertext
    finally:
        stop.set()
        thread.join()
    return refused[0]


def test_repr_hides_the_key() -> None:
    client, _ = ends()
    assert repr(client) == 'SessionKey(<secret>, role="client")'
    assert SECRET.hex() not in repr(client)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_encrypt_decrypt_keeps_rss_bounded() -> None:
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    client, server = ends()
    body = [BODY, bytearray(BODY)]
    for seq_id in range(1, 1_001):
        server.decrypt(*client.encrypt(obs(seq_id), body))
    before = rss()
    for seq_id in range(1_001, 11_001):
        server.decrypt(*client.encrypt(obs(seq_id), body))
        with pytest.raises(AuthError):
            server.decrypt(unauthenticated(obs(seq_id)), BODY)
    assert rss() - before < 8 * 2**20


# ------------------------------------------------------------------------------ buffers in place


def test_encrypt_in_place_writes_the_ciphertext_where_the_body_lies() -> None:
    expected = ends()[0].encrypt(HEADER, BODY)
    client, server = ends()
    buffer = bytearray(BODY)
    assert client.encrypt_in_place(HEADER, buffer) == expected[0]
    assert buffer == expected[1]
    assert server.decrypt(expected[0], buffer) == (HEADER, BODY)
    untouched = bytearray(BODY)
    with pytest.raises(AuthError, match="nonce would repeat"):
        client.encrypt_in_place(HEADER, untouched)
    assert untouched == BODY
    with pytest.raises(BufferError):
        client.encrypt_in_place(obs(99), BODY)  # bytes are read-only


class Payload:
    """A body still in Zenoh: no buffer protocol, converted by ``bytes()`` (like a ``ZBytes``)."""

    def __init__(self, data: bytes, *, keep: bool = False) -> None:
        self.data, self.keep = data, keep
        self.made: list[bytes] = []
        self.made_ids: list[int] = []

    def __bytes__(self) -> bytes:
        made = bytes(bytearray(self.data))  # a new object each time, as ZBytes.to_bytes makes
        self.made_ids.append(id(made))
        if self.keep:
            self.made.append(made)
        return made


@pytest.mark.parametrize("size", [0, 1, 2, 1000, 70 * 1024])
def test_a_body_still_in_zenoh_is_decrypted_in_its_one_copy(size: int) -> None:
    client, server = ends()
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    attachment, ciphertext = client.encrypt(HEADER, body)
    payload = Payload(ciphertext)
    header, plaintext = server.decrypt(attachment, payload)
    assert (header, plaintext) == (HEADER, body)
    if size >= 2:  # shorter bytes may be shared singletons: copied
        assert id(plaintext) == payload.made_ids[0]  # decrypted in place: no second buffer
    # Bytes somebody else still holds are never changed: they are copied instead.
    kept = Payload(ciphertext, keep=True)
    assert server.decrypt(attachment, kept) == (HEADER, body)
    assert kept.made == [ciphertext]


def test_a_zenoh_payload_is_decrypted_and_a_forged_one_refused() -> None:
    zenoh = pytest.importorskip("zenoh")
    client, server = ends()
    attachment, ciphertext = client.encrypt(HEADER, BODY)
    assert server.decrypt(attachment, zenoh.ZBytes(ciphertext)) == (HEADER, BODY)
    with pytest.raises(AuthError, match="tag mismatch"):
        server.decrypt(attachment, zenoh.ZBytes(ciphertext[:-1] + b"\x00"))
    with pytest.raises(TypeError):
        server.decrypt(attachment, 3)  # type: ignore[arg-type]
