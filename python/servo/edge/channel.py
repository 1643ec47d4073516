"""What the control loop and the edge's main process share besides the action queue.

One `servo._core.SharedMemory` block: a memfd when the loop runs in the control process, private
memory when it runs on a thread (the sequential engine); both sides use the same methods::

    counters     state, realtime, ticks, actions executed, commands sent, missed deadlines,
                 max lateness, fault, stop, park generation reached, recording, wake threshold
    observation  seqlock   tick, monotonic ns, queue position,    loop → main   newest wins
                           joint state
    command      seqlock   park generation, tolerance, pose       main → loop   newest wins
    fault        seqlock   one line of text, written once         loop → main
    lateness     histogram of tick lateness (10 µs bins to 10 ms, 1 ms bins to 1 s)   loop → main
    records      ring of recorder entries (dropped, and counted, when the main process lags)

Nothing here is a lock: the loop never waits on the main process (a write is a few atomic
stores; a command the loop reads while it is being written is read on the next tick), and the
main process never waits on the loop. Statistics are bounded by construction: counters, a
fixed histogram and a fixed ring, whatever the uptime.
"""

from __future__ import annotations

import contextlib
import enum
import os
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servo._core import Counters, Provenance, Ring, Seqlock, SharedMemory
from servo.recording import Source

FloatArray = npt.NDArray[np.float32]


class Slot(enum.IntEnum):
    """Counter slots of the channel."""

    STATE = 0
    REALTIME = 1
    TICKS = 2
    ACTIONS = 3
    COMMANDS = 4
    MISSED = 5
    MAX_LATENESS_NS = 6
    FAULT = 7
    STOP = 8
    PARKED = 9
    RECORDING = 10
    WAKE_BELOW = 11


class LoopState(enum.IntEnum):
    """Where the control loop is (``Slot.STATE``)."""

    STARTING = 0
    RUNNING = 1
    STOPPED = 2


#: Lateness histogram: 10 µs bins up to 10 ms, 1 ms bins up to 1 s, one overflow bin.
_FINE_BINS, _FINE_NS = 1000, 10_000
_COARSE_BINS, _COARSE_NS = 990, 1_000_000
LATENESS_BINS = _FINE_BINS + _COARSE_BINS + 1

#: Recorder entries buffered in shared memory (10 s at 100 Hz) before the loop drops them.
RECORD_SLOTS = 1024
#: The fault line's size (a robot's refusal to start names a port, a file and the fix).
FAULT_BYTES = 1024

_SOURCES: tuple[Source, ...] = ("none", "policy", "fallback", "replay", "park")
_SOURCE_CODE = {name: code for code, name in enumerate(_SOURCES)}
# tick, mono_ns, flags (bit 0: command, bit 1: provenance, bits 8..15: source), provenance
_RECORD_HEAD = struct.Struct("<qqQ16sQQqQ")
# tick, mono_ns, the action queue's position (`ActionQueue.get_position`) when it was taken
_OBSERVATION_HEAD = struct.Struct("<QqQ")
_COMMAND_HEAD = struct.Struct("<Qd")


def lateness_bin(ns: int) -> int:
    """Histogram bin of a lateness (ns, >= 0)."""
    if ns < _FINE_BINS * _FINE_NS:
        return ns // _FINE_NS
    coarse = (ns - _FINE_BINS * _FINE_NS) // _COARSE_NS
    return _FINE_BINS + min(coarse, _COARSE_BINS)


def _bin_upper_ns(index: int) -> int:
    if index < _FINE_BINS:
        return (index + 1) * _FINE_NS
    return _FINE_BINS * _FINE_NS + (index - _FINE_BINS + 1) * _COARSE_NS


def lateness_percentiles_ms(counts: npt.NDArray[np.uint64], quantiles: list[float], max_ns: int) -> list[float] | None:
    """Upper bin edges (ms) of the given quantiles, capped at the observed maximum; None if empty.

    Bin edges over-report by at most the bin width (10 µs below 10 ms): a percentile here is an
    upper bound of the true one.
    """
    total = int(counts.sum())
    if total == 0:
        return None
    cumulative = np.cumsum(counts)
    out = []
    for q in quantiles:
        index = int(np.searchsorted(cumulative, max(1, int(np.ceil(q * total)))))
        out.append(round(min(_bin_upper_ns(index), max_ns) / 1e6, 3))
    return out


class Bell:
    """One byte down a pipe per event the main process should hear about at once.

    Owned by the control loop (the pipe's write end). Never blocks: a full pipe drops the byte
    (the main process also polls the channel). Closing it (the loop ended, or its process died:
    the kernel closes the descriptor) is the main process's end-of-loop signal.
    """

    RUNNING = b"r"
    QUEUE_LOW = b"q"
    PARKED = b"p"
    FAULT = b"f"

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd

    def ring(self, event: bytes) -> None:
        """Signal ``event`` (dropped if the main process is far behind)."""
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.fd, event)

    def close(self) -> None:
        """End of the loop."""
        os.close(self.fd)


@dataclass
class Tick:
    """One control tick as the loop saw it (the recorder owns the arrays once it has it)."""

    tick: int
    mono_ns: int
    state: FloatArray
    action: FloatArray | None
    source: Source
    provenance: Provenance | None
    images: dict[str, npt.NDArray[np.uint8]] | None = None


@dataclass(frozen=True)
class LoopStats:
    """A snapshot of the control loop's counters (tick lateness in ms)."""

    state: LoopState
    realtime: bool
    ticks: int
    actions_executed: int
    commands_sent: int
    missed_deadlines: int
    lateness_ms: dict[str, float | None]
    records_dropped: int
    fault: str


def _layout(action_dim: int) -> tuple[dict[str, int], int]:
    """Offsets of a channel's parts, and its size."""
    state_bytes = 4 * action_dim
    sizes = {
        "counters": Counters.size(len(Slot)),
        "observation": Seqlock.size(_OBSERVATION_HEAD.size + state_bytes),
        "command": Seqlock.size(_COMMAND_HEAD.size + state_bytes),
        "fault": Seqlock.size(FAULT_BYTES),
        "lateness": Counters.size(LATENESS_BINS),
        "records": Ring.size(_RECORD_HEAD.size + 2 * state_bytes, RECORD_SLOTS),
    }
    offsets, end = {}, 0
    for name, size in sizes.items():
        offsets[name], end = end, end + size
    return offsets, end


class ControlChannel:
    """The block shared by the control loop and the main process (see the module docstring).

    Either side may be in either process; each method says whose it is. Made with `create`
    (main process) or `attach` (control process).
    """

    def __init__(self, memory: SharedMemory, action_dim: int) -> None:
        self.memory = memory
        self.action_dim = action_dim
        at, _ = _layout(action_dim)
        state_bytes = 4 * action_dim
        self.record_bytes = _RECORD_HEAD.size + 2 * state_bytes
        self._counters = memory.counters(at["counters"], len(Slot))
        self._observation = memory.seqlock(at["observation"], _OBSERVATION_HEAD.size + state_bytes)
        self._command = memory.seqlock(at["command"], _COMMAND_HEAD.size + state_bytes)
        self._fault = memory.seqlock(at["fault"], FAULT_BYTES)
        self._lateness = memory.counters(at["lateness"], LATENESS_BINS)
        self._records = memory.ring(at["records"], self.record_bytes, RECORD_SLOTS)
        self._command_version = 0
        # The loop's writes are packed into these buffers (one per message kind), so a tick
        # builds no bytes objects of its own; the seqlock and the ring copy them in.
        self._observation_out = bytearray(_OBSERVATION_HEAD.size + state_bytes)
        self._observation_state = np.frombuffer(self._observation_out, np.float32, action_dim, _OBSERVATION_HEAD.size)
        self._record_out = bytearray(self.record_bytes)
        self._record_state = np.frombuffer(self._record_out, np.float32, action_dim, _RECORD_HEAD.size)
        self._record_command = np.frombuffer(self._record_out, np.float32, action_dim, _RECORD_HEAD.size + state_bytes)

    @staticmethod
    def size(action_dim: int) -> int:
        """Bytes of a channel for ``action_dim`` joints."""
        return _layout(action_dim)[1]

    @classmethod
    def create(cls, action_dim: int, *, shared: bool, recording: bool = False) -> ControlChannel:
        """Main process: a fresh channel (``shared``: mappable by a control process)."""
        channel = cls(SharedMemory(cls.size(action_dim), shared=shared), action_dim)
        channel._counters.set(Slot.RECORDING, int(recording))
        return channel

    @classmethod
    def attach(cls, fd: int, action_dim: int) -> ControlChannel:
        """Control process: the channel behind ``fd``.

        Raises:
            OSError, ValueError: ``fd`` cannot be mapped, or is too small for ``action_dim``.
        """
        return cls(SharedMemory.attach(fd), action_dim)

    # ------------------------------------------------------------------ control loop side
    def publish(self, tick: int, mono_ns: int, position: int, state: FloatArray) -> None:
        """Loop: the newest observation and the queue position it was taken at (newest wins)."""
        _OBSERVATION_HEAD.pack_into(self._observation_out, 0, tick, mono_ns, position)
        self._observation_state[:] = state
        self._observation.write(self._observation_out)

    def set_state(self, state: LoopState, *, realtime: bool | None = None) -> None:
        """Loop: where it is (and, once running, whether it got real-time scheduling)."""
        if realtime is not None:
            self._counters.set(Slot.REALTIME, int(realtime))
        self._counters.set(Slot.STATE, int(state))

    def stop_requested(self) -> bool:
        """Loop: whether the main process asked it to stop."""
        return bool(self._counters.get(Slot.STOP))

    def park_command(self) -> tuple[int, float, FloatArray] | None:
        """Loop: a park command written since the last call: (generation, tolerance, pose)."""
        version = self._command.version
        if version == self._command_version:
            return None
        record = self._command.read()
        if record is None:
            return None  # being written right now: next tick
        self._command_version = version
        generation, tolerance = _COMMAND_HEAD.unpack_from(record)
        pose = np.frombuffer(record, np.float32, self.action_dim, _COMMAND_HEAD.size).copy()
        return generation, tolerance, pose

    def acknowledge_park(self, generation: int) -> None:
        """Loop: the pose of park command ``generation`` is reached."""
        self._counters.max(Slot.PARKED, generation)

    def count(self, slot: Slot, delta: int = 1) -> None:
        """Loop: add to a counter."""
        self._counters.add(slot, delta)

    def note_lateness(self, lateness_ns: int) -> None:
        """Loop: one tick started ``lateness_ns`` after its deadline (early counts as late)."""
        lateness = abs(lateness_ns)
        self._lateness.add(lateness_bin(lateness))
        self._counters.max(Slot.MAX_LATENESS_NS, lateness)

    def raise_fault(self, message: str) -> bool:
        """Loop: latch a fault (the first one wins); True if this call raised it."""
        if self._counters.get(Slot.FAULT):
            return False
        self._fault.write(message.encode("utf-8", "replace")[:FAULT_BYTES])
        self._counters.set(Slot.FAULT, 1)
        return True

    def wake_below(self) -> int:
        """Loop: the queue size the main process wants to hear about (0: nobody waits)."""
        return self._counters.get(Slot.WAKE_BELOW)

    def take_wake(self) -> bool:
        """Loop: claim the armed wake-up (one ring per arming)."""
        return self._counters.swap(Slot.WAKE_BELOW, 0) != 0

    def record(
        self,
        tick: int,
        mono_ns: int,
        state: FloatArray,
        command: FloatArray | None,
        source: Source,
        provenance: Provenance | None,
    ) -> None:
        """Loop: one recorder entry if recording (dropped, and counted, when the ring is full)."""
        if not self._counters.get(Slot.RECORDING):
            return
        flags = _SOURCE_CODE[source] << 8 | (command is not None) | (provenance is not None) << 1
        p = provenance
        prov = (bytes.fromhex(p.session_id), p.seq_id, p.episode_id, p.obs_mono_ns, p.step) if p else (b"", 0, 0, 0, 0)
        _RECORD_HEAD.pack_into(self._record_out, 0, tick, mono_ns, flags, *prov)
        self._record_state[:] = state
        self._record_command[:] = 0.0 if command is None else command
        self._records.push(self._record_out)

    # ------------------------------------------------------------------ main process side
    def latest(self) -> tuple[int, int, int, FloatArray] | None:
        """Main: the newest observation (tick, monotonic ns, queue position, state), or None before the first."""
        if self._observation.version == 0:
            return None
        record = self._observation.read(attempts=100)
        if record is None:
            return None
        tick, mono_ns, position = _OBSERVATION_HEAD.unpack_from(record)
        return tick, mono_ns, position, np.frombuffer(record, np.float32, self.action_dim, _OBSERVATION_HEAD.size)

    def latest_pose(self) -> FloatArray | None:
        """Main: the newest joint state (the `PoseSource` of simulated cameras)."""
        latest = self.latest()
        return None if latest is None else latest[3]

    def request_park(self, pose: FloatArray, tolerance: float) -> int:
        """Main: drive to ``pose``; returns the generation `parked` will report."""
        generation = self._command.version + 1
        self._command.write(_COMMAND_HEAD.pack(generation, tolerance) + np.asarray(pose, np.float32).tobytes())
        return generation

    def parked(self, generation: int) -> bool:
        """Main: whether park command ``generation`` reached its pose."""
        return self._counters.get(Slot.PARKED) >= generation

    def request_stop(self) -> None:
        """Main: stop after the current tick."""
        self._counters.set(Slot.STOP, 1)

    def arm_wake(self, below: int) -> None:
        """Main: ring once the queue holds fewer than ``below`` actions."""
        self._counters.set(Slot.WAKE_BELOW, below)

    @property
    def state(self) -> LoopState:
        """Main: where the loop is."""
        return LoopState(self._counters.get(Slot.STATE))

    def fault(self) -> str:
        """Main: the latched fault, or ""."""
        if not self._counters.get(Slot.FAULT):
            return ""
        text = self._fault.read(attempts=100) or b""
        return text.rstrip(b"\0").decode("utf-8", "replace")

    def lateness_counts(self) -> npt.NDArray[np.uint64]:
        """Main: the lateness histogram (a copy)."""
        return self._lateness.read()

    def statistics(self) -> LoopStats:
        """Main: a snapshot of the counters."""
        counters = self._counters.read()
        max_ns = int(counters[Slot.MAX_LATENESS_NS])
        points = lateness_percentiles_ms(self.lateness_counts(), [0.5, 0.99], max_ns)
        return LoopStats(
            state=LoopState(int(counters[Slot.STATE])),
            realtime=bool(counters[Slot.REALTIME]),
            ticks=int(counters[Slot.TICKS]),
            actions_executed=int(counters[Slot.ACTIONS]),
            commands_sent=int(counters[Slot.COMMANDS]),
            missed_deadlines=int(counters[Slot.MISSED]),
            lateness_ms={
                "p50": None if points is None else points[0],
                "p99": None if points is None else points[1],
                "max": None if points is None else round(max_ns / 1e6, 3),
            },
            records_dropped=self._records.dropped,
            fault=self.fault(),
        )

    def drain(self) -> list[Tick]:
        """Main: the recorder entries waiting in the ring, oldest first."""
        out = []
        dim = self.action_dim
        while (record := self._records.pop()) is not None:
            tick, mono_ns, flags, session, seq_id, episode_id, obs_ns, step = _RECORD_HEAD.unpack_from(record)
            state = np.frombuffer(record, np.float32, dim, _RECORD_HEAD.size).copy()
            command = np.frombuffer(record, np.float32, dim, _RECORD_HEAD.size + 4 * dim).copy() if flags & 1 else None
            provenance = Provenance(session.hex(), seq_id, episode_id, obs_ns, step) if flags & 2 else None
            out.append(Tick(tick, mono_ns, state, command, _SOURCES[flags >> 8 & 0xFF], provenance))
        return out
