"""Episode recordings: what the edge executed, frame by frame, with provenance.

File layout (``*.servo``): the 8-byte magic ``SERVOEP1``, then records, each a little-endian
u32 length followed by a msgpack body. The first record is an `EpisodeHeader`, every further
one a `FrameRecord`. Append-only and streamable, so a crash loses at most the record being
written; readable without servo through any msgpack library.

Each frame holds the measured state, the action sent to the robot (after the safety layer),
where that action came from (``policy``, ``fallback``, ``replay``, ``park`` at teardown, ``none``
= hold) and, for policy actions, the (session_id, seq_id, episode_id, obs_mono_ns) of the chunk
it belongs to — the join key with the server's audit log (the session id as 32 hex characters) —
and the step the action was meant for (its observation's tick plus its index in the chunk: what
`servo.edge.exactness` checks), and the edge's fail-safe transitions made since the previous frame
(each with its own monotonic time). The header holds the edge's wall clock and monotonic clock
read at the same moment, so a time of day ("14:03") maps onto the frames' monotonic stamps
(`servo-trace`); both clocks are the edge's own.

A file is input like any other: `read_recording` checks what a replay would execute (fps > 0 and
finite, every state and action as wide as the header's joints, every value finite) and refuses a
file that breaks a rule with one line naming the file, the frame and the field.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import msgspec
import numpy as np

from servo.private_files import private_opener
from servo.wire import EncodedImage, Tensor, WireError, decode_tensor

MAGIC = b"SERVOEP1"
_LEN = struct.Struct("<I")
MAX_RECORD_BYTES = 256 * 1024 * 1024

Source = Literal["policy", "fallback", "replay", "park", "none"]


class EpisodeHeader(msgspec.Struct, frozen=True):
    """First record of a recording."""

    robot: str
    fps: float
    joint_names: list[str]
    episode_id: int = 0
    client_id: str = ""
    task: str = ""
    cameras: dict[str, list[int]] = {}
    #: The edge's wall clock (ns since the epoch) and monotonic clock read together at the start (0: unknown).
    start_wall_ns: int = 0
    start_mono_ns: int = 0

    def wall_ns(self, mono_ns: int) -> int | None:
        """The edge's wall-clock time of a monotonic stamp of this recording (None without the pair)."""
        if not self.start_wall_ns:
            return None
        return self.start_wall_ns + (mono_ns - self.start_mono_ns)


class FrameRecord(msgspec.Struct, frozen=True):
    """One control tick."""

    tick: int
    mono_ns: int
    state: Tensor
    action: Tensor | None
    source: Source
    #: (session id as 32 hex characters, seq_id, episode_id, obs_mono_ns) of a policy action.
    provenance: tuple[str, int, int, int] | None = None
    #: The tick a policy action was meant for: its observation's tick plus its index in the chunk.
    step: int | None = None
    images: dict[str, EncodedImage] = {}
    #: Fail-safe transitions since the previous frame: (monotonic ns, state, reason).
    transitions: list[tuple[int, str, str]] = []


class RecordingWriter:
    """Appends records to a file. Owned by the recorder's writer thread."""

    def __init__(self, path: str | Path, header: EpisodeHeader) -> None:
        self.path = Path(path)
        # What the robot saw and did (its cameras too): created readable by this user alone.
        self._file: IO[bytes] = open(self.path, "wb", opener=private_opener)  # noqa: SIM115
        self._file.write(MAGIC)
        self.write(header)

    def write(self, record: EpisodeHeader | FrameRecord) -> None:
        """Append one record."""
        body = msgspec.msgpack.encode(record)
        self._file.write(_LEN.pack(len(body)))
        self._file.write(body)

    def close(self) -> None:
        """Flush and close."""
        self._file.close()


@dataclass(frozen=True)
class Recording:
    """A recording read back into memory."""

    header: EpisodeHeader
    frames: list[FrameRecord]

    def actions(self) -> np.ndarray:
        """Executed actions (T, D) float32; ticks without an action repeat the previous one."""
        out = []
        last = None
        for frame in self.frames:
            if frame.action is not None:
                last = np.array(decode_tensor(frame.action, dtype="float32"), dtype=np.float32)
            if last is not None:
                out.append(last)
        dim = len(self.header.joint_names)
        return np.array(out, dtype=np.float32).reshape(-1, dim)

    def states(self) -> np.ndarray:
        """Measured states (T, D) float32."""
        dim = len(self.header.joint_names)
        rows = [decode_tensor(f.state, dtype="float32") for f in self.frames]
        return np.array(rows, dtype=np.float32).reshape(-1, dim)


def iter_records(path: str | Path) -> Iterator[EpisodeHeader | FrameRecord]:
    """Stream the records of a recording; a truncated final record is ignored (crash tolerance).

    Raises:
        WireError: not a servo recording, or a corrupt record.
    """
    header_decoder = msgspec.msgpack.Decoder(EpisodeHeader)
    frame_decoder = msgspec.msgpack.Decoder(FrameRecord)
    with Path(path).open("rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise WireError(f"{path}: not a servo recording (bad magic)")
        first = True
        while True:
            prefix = f.read(_LEN.size)
            if len(prefix) < _LEN.size:
                return
            (size,) = _LEN.unpack(prefix)
            if size > MAX_RECORD_BYTES:
                raise WireError(f"{path}: record of {size} bytes exceeds {MAX_RECORD_BYTES}")
            body = f.read(size)
            if len(body) < size:
                return
            try:
                record = header_decoder.decode(body) if first else frame_decoder.decode(body)
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                raise WireError(f"{path}: corrupt record: {exc}") from None
            yield record
            first = False


def read_recording(path: str | Path) -> Recording:
    """Load a whole recording, checked (see the module docstring).

    Raises:
        WireError: not a recording, corrupt, empty (no header), or a rule broken (the message
            names the file, the frame and the field).
    """
    records = iter_records(path)
    header = next(records, None)
    if not isinstance(header, EpisodeHeader):
        raise WireError(f"{path}: recording has no header")
    check_rate(header.fps, f"{path}: header.fps")
    if not header.joint_names:
        raise WireError(f"{path}: header.joint_names is empty")
    dim = len(header.joint_names)
    frames: list[FrameRecord] = []
    for record in records:
        if not isinstance(record, FrameRecord):
            continue
        where = f"{path}: frame {len(frames)} (tick {record.tick})"
        check_row(record.state, dim, f"{where} state")
        if record.action is not None:
            check_row(record.action, dim, f"{where} action")
        frames.append(record)
    return Recording(header, frames)


def check_rate(fps: float, what: str) -> None:
    """Refuse a frame rate that is not a finite number > 0 (``what`` names it in the error)."""
    if not (math.isfinite(fps) and fps > 0):
        raise WireError(f"{what} = {fps!r}: expected a finite number > 0")


def check_row(tensor: Tensor, dim: int, what: str) -> None:
    """Refuse a joint vector that is not ``dim`` finite float32 values."""
    values = decode_tensor(tensor, dtype="float32", what=what)
    if values.shape != (dim,):
        raise WireError(f"{what} has shape {values.shape}, the header names {dim} joints")
    if not np.isfinite(values).all():
        raise WireError(f"{what} contains NaN or inf")
