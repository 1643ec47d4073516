"""What encrypting session payloads costs beside the MAC it replaced, in one run.

Smoke test: ``pytest benches/bench_cipher.py --benchmark-disable``.
Measure: ``pytest benches/bench_cipher.py --benchmark-enable --benchmark-only`` (writes
``benches/results/cipher.md``).

Each case is one message through servo's code as the callers see it, on the sender (encode,
protect, the copy into Zenoh a put makes) and on the receiver (its copy out of Zenoh, its check),
which run in different processes; and the protection's two passes alone. Only the protection
differs:

* ``mac`` (wire schema 2, the baseline): the body is encoded into a new ``bytes``, keyed BLAKE3
  of header || body on the sender and again on the receiver, after its copy out of Zenoh
  (`SessionKey.authenticate` / `SessionKey.verify` are that same MAC, kept for resume proofs);
  the body travels in the clear.
* ``aes-256-gcm`` (schema 3): an observation is encoded into the uplink's reused buffer and
  encrypted there (`SessionKey.encrypt_in_place`); a chunk is encrypted into a new ``bytes`` as
  the server does (`SessionKey.encrypt`). The receiver decrypts in the one copy it makes out of
  Zenoh (`SessionKey.decrypt` of the ``ZBytes``).

Messages: a raw two-camera observation (two 480x640 RGB frames and a 6-d state: 1.84 MB) and
the `ActionChunk` of a 50x6 float32 chunk. Target (reported, not asserted): the cipher costs no
more than the MAC.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import pytest
import zenoh

from benches._support import markdown, results_table
from servo import _core
from servo._core import ATTACHMENT_SIZE, MSG_CHUNK, MSG_OBS, SCHEMA_VERSION, Header, SessionKey
from servo.wire import ActionChunk, EncodedImage, Observation, encode, encode_into, encode_tensor

if _core.build_profile != "release":
    pytest.skip(
        f"servo._core is a {_core.build_profile} build; benchmarks only measure release builds",
        allow_module_level=True,
    )

SECRET = bytes(range(32))
OBS_HEADER = Header(SCHEMA_VERSION, MSG_OBS, 1, 1, 7, 3, 123_456_789, bytes(range(16)))
CHUNK_HEADER = OBS_HEADER.replace(msg_type=MSG_CHUNK, flags=0)
_rng = np.random.default_rng(1)
FRAMES = {name: memoryview(_rng.bytes(480 * 640 * 3)) for name in ("front", "wrist")}
MESSAGES: dict[str, tuple[msgspec.Struct, Header]] = {
    "observation 1.84 MB": (
        Observation(
            state=encode_tensor(_rng.random(6, np.float32)),
            images={name: EncodedImage("raw", 480, 640, data) for name, data in FRAMES.items()},
        ),
        OBS_HEADER,
    ),
    "chunk 50x6": (ActionChunk(encode_tensor(_rng.random((50, 6), np.float32)), 12.5, 30.0), CHUNK_HEADER),
}


def ends(header: Header) -> tuple[SessionKey, SessionKey]:
    """(sender, receiver) keys for a message of ``header``'s type."""
    client, server = SessionKey(SECRET, role="client"), SessionKey(SECRET, role="server")
    return (client, server) if header.msg_type == MSG_OBS else (server, client)


def mac_sender(message: msgspec.Struct, header: Header) -> Callable[[], bool]:
    """Schema 2's sender: encode into a new ``bytes``, MAC it, into Zenoh."""
    sender, _ = ends(header)

    def run() -> bool:
        body = encode(message)
        attachment = sender.authenticate(header, body)
        return len(zenoh.ZBytes(body)) == len(body) and len(attachment) == ATTACHMENT_SIZE

    return run


def aead_sender(message: msgspec.Struct, header: Header) -> Callable[[], bool]:
    """Schema 3's sender: an observation is encoded into the uplink's reused buffer and encrypted
    there; a chunk is encrypted into a new ``bytes`` (the server's reply thread). Then into Zenoh."""
    sender, _ = ends(header)
    seqs = itertools.count(1)  # a fresh seq_id each time: a nonce never repeats
    buffer = bytearray()

    def run() -> bool:
        stamped = header.replace(seq_id=next(seqs))
        if header.msg_type == MSG_OBS:
            encode_into(message, buffer)
            attachment, sent = sender.encrypt_in_place(stamped, buffer), zenoh.ZBytes(buffer)
        else:
            attachment, ciphertext = sender.encrypt(stamped, encode(message))
            sent = zenoh.ZBytes(ciphertext)
        return len(sent) > 0 and len(attachment) == ATTACHMENT_SIZE

    return run


def mac_receiver(message: msgspec.Struct, header: Header) -> Callable[[], bool]:
    """Schema 2's receiver: copy the body out of Zenoh, MAC it again."""
    sender, receiver = ends(header)
    body = encode(message)
    attachment, received = sender.authenticate(header, body), zenoh.ZBytes(body)
    return lambda: receiver.verify(attachment, received.to_bytes()) == header


def aead_receiver(message: msgspec.Struct, header: Header) -> Callable[[], bool]:
    """Schema 3's receiver: decrypt in the one copy it makes out of Zenoh."""
    sender, receiver = ends(header)
    attachment, ciphertext = sender.encrypt(header, encode(message))
    received = zenoh.ZBytes(ciphertext)
    return lambda: receiver.decrypt(attachment, received)[0] == header


def mac_alone(message: msgspec.Struct, header: Header) -> Callable[[], bool]:
    """The MAC passes alone: sender and receiver over one encoded body (no copy at all)."""
    sender, receiver = ends(header)
    body = encode(message)
    return lambda: receiver.verify(sender.authenticate(header, body), body) == header


def aead_alone(message: msgspec.Struct, header: Header) -> Callable[[], bool]:
    """The cipher passes alone: encrypt a reused buffer in place, decrypt into the receiver's new buffer."""
    sender, receiver = ends(header)
    seqs = itertools.count(1)
    plain = encode(message)
    buffer = bytearray(plain)

    def run() -> bool:
        stamped = header.replace(seq_id=next(seqs))
        buffer[:] = plain  # a memcpy standing in for the encode that refills the buffer
        return receiver.decrypt(sender.encrypt_in_place(stamped, buffer), buffer)[0] == stamped

    return run


#: (path, protection) -> one message's way through that path.
IMPLS: dict[tuple[str, str], Callable[[msgspec.Struct, Header], Callable[[], bool]]] = {
    ("sender", "mac"): mac_sender,
    ("sender", "aes-256-gcm"): aead_sender,
    ("receiver", "mac"): mac_receiver,
    ("receiver", "aes-256-gcm"): aead_receiver,
    ("protection alone", "mac"): mac_alone,
    ("protection alone", "aes-256-gcm"): aead_alone,
}


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "cipher.md")


def render(rows: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, str], dict[str, str]] = {}
    ratio: dict[tuple[str, str], dict[str, float]] = {}
    for row in rows:
        key = (row["body"], row["path"])
        cells.setdefault(key, {})[row["impl"]] = f"{row['median_us']:.1f} ({row['min_us']:.1f})"
        ratio.setdefault(key, {})[row["impl"]] = row["median_us"]
    lines = [
        (body, path, got.get("mac", "-"), got.get("aes-256-gcm", "-"), _ratio(ratio[body, path]))
        for (body, path), got in cells.items()
    ]
    return markdown(
        "One message, sender and receiver, median (min) µs (pytest-benchmark, one run, same process, "
        "`pytest benches/bench_cipher.py --benchmark-enable --benchmark-only`): schema 2's keyed-BLAKE3 MAC "
        "(authenticated, readable by anyone on the link) beside schema 3's AES-256-GCM (encrypted and "
        "authenticated). Sender: encode, protect, into Zenoh (ZBytes) as servo's code does it (schema 3 "
        "encrypts an observation in the uplink's reused buffer); receiver: out of Zenoh and check (schema 3 "
        "decrypts in that one copy); they run in different processes. Protection alone: both passes over "
        "one body in one process (the cipher's receiver writes a new buffer).",
        ["message", "path", "MAC (schema 2)", "AES-256-GCM (schema 3)", "cipher / MAC (median)"],
        lines,
    )


def _ratio(medians: dict[str, float]) -> str:
    mac, aead = medians.get("mac"), medians.get("aes-256-gcm")
    return "-" if not mac or aead is None else f"{aead / mac:.2f}"


@pytest.mark.benchmark(group="session-payload")
@pytest.mark.parametrize("body", list(MESSAGES))
@pytest.mark.parametrize("impl", list(IMPLS), ids=[f"{path}-{impl}" for path, impl in IMPLS])
def test_session_payload(benchmark: Any, table: list[dict[str, Any]], impl: tuple[str, str], body: str) -> None:
    assert benchmark(IMPLS[impl](*MESSAGES[body]))
    stats = benchmark.stats  # None when run as a smoke test (--benchmark-disable)
    nan = float("nan")
    median, least = (nan, nan) if stats is None else (stats.stats.median * 1e6, stats.stats.min * 1e6)
    table.append(
        {"path": impl[0], "impl": impl[1], "body": body, "smoke": stats is None, "median_us": median, "min_us": least}
    )
