"""Coverage-guided fuzzing of every decoder a hostile peer (or file) can reach: ``make fuzz``.

One atheris target: the first input byte picks the decoder, the rest is its input, seeded with a
valid encoding of every message type (mutations of real messages reach far deeper than noise).
Each decoder may only fail with its documented error type — `WireError` for the wire layer and
recordings, `HeaderError` / `AuthError` for the Rust codecs, `CertificateError` for the DER walk;
anything else is a bug and stops the run with the input that caused it. The run ends after
``--runs`` inputs (default 10⁶) and prints the process RSS before and after.

Not collected by pytest (no ``test_`` prefix); run it as ``python -m tests.fuzz.fuzz_decoders``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import msgspec
    import numpy as np

    from servo._core import SCHEMA_VERSION, AuthError, Header, HeaderError, SessionKey, decode_header, unauthenticated
    from servo.recording import MAGIC, EpisodeHeader, FrameRecord, read_recording
    from servo.transport.certificate import CertificateError, subject_common_name
    from servo.wire import (
        MESSAGE_TYPES,
        EncodedImage,
        Observation,
        Tensor,
        WireError,
        decode,
        decode_image,
        decode_tensor,
        encode,
        encode_tensor,
    )

import contextlib

from testbed.processes import rss_mb
from tests.wire.test_decoders import SAMPLES

SECRET = bytes(range(32))
KEY = SessionKey(SECRET, role="server")
RECORDING = Path(tempfile.gettempdir()) / f"servo-fuzz-{os.getpid()}.servo"


def _message(kind: type) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        try:
            message = decode(data, kind)
        except WireError:
            return
        _payloads(message)

    return run


def _payloads(message: object) -> None:
    """What a receiver does next with a message that decoded: its tensors and images."""
    tensors = [getattr(message, name, None) for name in ("state", "chunk_robot", "chunk_model", "positions")]
    if isinstance(message, Observation):
        tensors += [message.prefix_model, message.prefix_robot]
        for name, image in message.images.items():
            with contextlib.suppress(WireError):
                decode_image(image, what=name, max_pixels=1 << 20)
    for tensor in tensors:
        if isinstance(tensor, Tensor):
            with contextlib.suppress(WireError):
                decode_tensor(tensor)


def _header(data: bytes) -> None:
    with contextlib.suppress(HeaderError):
        decode_header(data)


def _attachment(data: bytes) -> None:
    split = data[0] if data else 0
    with contextlib.suppress(AuthError):
        KEY.decrypt(data[1 : 1 + split], data[1 + split :])


def _recording(data: bytes) -> None:
    RECORDING.write_bytes(MAGIC + data)
    with contextlib.suppress(WireError):
        read_recording(RECORDING)


def _certificate(data: bytes) -> None:
    with contextlib.suppress(CertificateError):
        subject_common_name(data)


def _tensor(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_tensor(decode(data, Tensor))


def _image(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_image(decode(data, EncodedImage), max_pixels=1 << 20)


TARGETS: list[Callable[[bytes], None]] = [
    *(_message(kind) for kind in MESSAGE_TYPES),
    _header,
    _attachment,
    _recording,
    _certificate,
    _tensor,
    _image,
]


#: Inputs after which libFuzzer's own tables are allocated; growth after this point would be ours.
WARM_UP = 10_000


class Run:
    """How many inputs ran; at the last one, the RSS after (libFuzzer exits without returning)."""

    runs = 0
    total = 0
    before = 0.0
    warm = 0.0


def one_input(data: bytes) -> None:
    """atheris entry point: byte 0 picks the decoder."""
    Run.runs += 1
    if data:
        TARGETS[data[0] % len(TARGETS)](data[1:])
    if Run.runs == WARM_UP:
        Run.warm = rss_mb()
    if Run.runs == Run.total:
        after = rss_mb()
        print(
            f"fuzz: {Run.runs} inputs, no unexpected exception; RSS before {Run.before:.1f} MiB, "
            f"after {WARM_UP} inputs {Run.warm:.1f} MiB (libFuzzer's corpus and coverage maps), "
            f"after all {after:.1f} MiB ({after - Run.warm:+.1f} since then)",
            flush=True,
        )


def seeds(directory: Path) -> None:
    """A valid input for every target (atheris mutates these)."""
    kinds = list(MESSAGE_TYPES)
    for i, kind in enumerate(kinds):
        (directory / f"msg-{i}").write_bytes(bytes([i]) + encode(SAMPLES[kind]))
    header = Header(SCHEMA_VERSION, 1, 0, 7, 1, 1, 123, bytes(16))
    base = len(kinds)
    (directory / "header").write_bytes(bytes([base]) + unauthenticated(header))
    body = b"body"
    attachment, ciphertext = SessionKey(SECRET, role="client").encrypt(header, body)
    (directory / "attachment").write_bytes(bytes([base + 1, 62]) + attachment + ciphertext)
    state = encode_tensor(np.zeros(2, np.float32))
    records = [
        msgspec.msgpack.encode(EpisodeHeader(robot="sim", fps=30.0, joint_names=["a", "b"])),
        msgspec.msgpack.encode(FrameRecord(0, 1, state, state, "policy", ("00" * 16, 1, 0, 1))),
    ]
    framed = b"".join(len(r).to_bytes(4, "little") + r for r in records)
    (directory / "recording").write_bytes(bytes([base + 2]) + framed)
    tensor = encode(SAMPLES[Observation].state)  # type: ignore[attr-defined]
    (directory / "tensor").write_bytes(bytes([base + 4]) + tensor)
    image = encode(next(iter(SAMPLES[Observation].images.values())))  # type: ignore[attr-defined]
    (directory / "image").write_bytes(bytes([base + 5]) + image)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.fuzz_decoders")
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs to try")
    args, rest = parser.parse_known_args()
    corpus = Path(tempfile.mkdtemp(prefix="servo-fuzz-corpus-"))
    seeds(corpus)
    for i in range(2000):  # warm caches and allocators before the "before" reading
        TARGETS[i % len(TARGETS)](b"\x00" * 8)
    Run.before, Run.total = rss_mb(), args.runs
    print(f"fuzz: {len(TARGETS)} decoders, {args.runs} inputs, RSS before {Run.before:.1f} MiB", flush=True)
    atheris.Setup(
        [sys.argv[0], f"-runs={args.runs}", "-max_len=65536", "-print_final_stats=1", *rest, str(corpus)],
        one_input,
    )
    try:
        atheris.Fuzz()
    finally:
        RECORDING.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
