# This stub is where the public docs of servo._core live (pydantic-core does the same), so
# docstrings are wanted here.
# ruff: noqa: PYI021
"""servo's Rust core: the action chunk queue, the attachment header codec, the latency tracker.

Everything here is small and hot; everything else in servo is Python. Three things live here:

* :class:`ActionQueue` -- the chunk buffer between the inference side (producer: ``merge``)
  and the robot control loop (consumer: ``get``). The consumer never waits on a producer.
* The attachment header codec (:class:`Header`, :func:`encode_header`,
  :func:`decode_header`) -- a fixed 30-byte packed little-endian header carried as the Zenoh
  attachment, so routing and correlation never deserialise a message body.
* :class:`LatencyTracker` -- monotonic-clock latency samples with a sliding window.

GIL policy: calls that copy O(chunk) or O(window) data release the GIL around the copy
(``ActionQueue.merge``, ``get_left_over``, ``get_processed_left_over``, ``clear``,
``LatencyTracker.percentile(s)``). Per-tick calls (``ActionQueue.get`` and friends, the header
codec, ``LatencyTracker.add``) copy at most one row or 30 bytes and never wait, so they keep
the GIL: releasing it on the control-loop thread would let another Python thread take it, and
the loop would then wait up to ``sys.getswitchinterval()`` (5 ms by default) to get it back.
"""

from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "FLAG_EPISODE_START",
    "HEADER_MAGIC",
    "HEADER_SIZE",
    "MSG_CHUNK",
    "MSG_DRAIN",
    "MSG_ERROR",
    "MSG_OBS",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "ActionQueue",
    "Header",
    "HeaderError",
    "LatencyTracker",
    "Provenance",
    "QueueError",
    "QueueStats",
    "__version__",
    "build_profile",
    "decode_header",
    "encode_header",
]

__version__: Final[str]
"""Version of the servo-core crate this module was built from."""

build_profile: Final[Literal["release", "debug"]]
"""Cargo profile of this build; benchmarks refuse to measure a ``"debug"`` build."""

# ----------------------------------------------------------------------------- ActionQueue

class QueueError(ValueError):
    """A chunk was rejected by :meth:`ActionQueue.merge`.

    Raised for a wrong dtype, a wrong number of dimensions, a wrong action dimension, an
    ``original``/``processed`` length mismatch, an empty chunk, or a merge that would exceed
    the queue's capacity. The message names the expected and the actual values, e.g.
    ``"processed has shape (50, 7), expected (T, 6)"``. The queue is left unchanged.
    """

@final
class Provenance:
    """Where an action chunk comes from; a frozen, tuple-like record.

    Every action of a merged chunk carries its chunk's provenance, so the edge can refuse
    actions older than its staleness bound and datasets can be joined with server logs.
    Iterating, indexing and ``len`` behave like the tuple
    ``(session_id, seq_id, episode_id, obs_mono_ns)``; instances are hashable and picklable.

    Args:
        session_id: Session the chunk was produced for.
        seq_id: Sequence number of the request the chunk answers.
        episode_id: Episode the chunk belongs to.
        obs_mono_ns: Monotonic time (ns, this host's clock) at which the observation the
            chunk answers was taken.
    """

    __match_args__: Final = ("session_id", "seq_id", "episode_id", "obs_mono_ns")

    def __new__(cls, session_id: int, seq_id: int, episode_id: int, obs_mono_ns: int) -> Provenance: ...
    @property
    def session_id(self) -> int:
        """Session the chunk was produced for (u64)."""

    @property
    def seq_id(self) -> int:
        """Sequence number of the request the chunk answers (u64)."""

    @property
    def episode_id(self) -> int:
        """Episode the chunk belongs to (u64)."""

    @property
    def obs_mono_ns(self) -> int:
        """Monotonic time (ns) of the observation the chunk answers (i64)."""

    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: Any, /) -> Any: ...
    def __iter__(self) -> Iterator[int]: ...
    def __reduce__(self) -> tuple[type[Provenance], tuple[int, int, int, int]]: ...

@final
class QueueStats:
    """A frozen snapshot of an ActionQueue's counters; see :meth:`ActionQueue.statistics`."""

    @property
    def merges(self) -> int:
        """Accepted merges since construction."""

    @property
    def rejected_merges(self) -> int:
        """Merges rejected with :class:`QueueError` since construction."""

    @property
    def delay_mismatches(self) -> int:
        """Merges whose ``idx_before`` disagreed with ``real_delay``."""

    @property
    def actions_consumed(self) -> int:
        """Actions handed out by ``get``/``get_with_provenance`` since construction."""

    @property
    def qsize(self) -> int:
        """Actions left when the snapshot was taken."""

    @property
    def action_index(self) -> int:
        """Consumer index (since the last merge or clear) when the snapshot was taken."""

    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...

@final
class ActionQueue:
    """Chunk buffer between the inference side and the robot control loop.

    Same semantics as LeRobot's RTC ``ActionQueue``. Two chunks are kept in lockstep: the
    *original* (model-space) actions, whose unexecuted prefix is shipped with the next request
    for RTC conditioning, and the *processed* (robot-space) actions the robot executes.

    * ``rtc=True`` (replace): a merge replaces the queue with the new chunk minus its first
      ``delay`` steps (they went by while the model was thinking).
    * ``rtc=False`` (append): a merge drops the consumed actions and appends the whole chunk.

    Threads: one control-loop thread (the consumer) calls :meth:`get` once per tick; the
    inference side (the producer: a worker thread or the event loop's chunk handler) calls
    :meth:`merge`, :meth:`get_action_index` and :meth:`get_left_over` when it sends a
    request, and :meth:`clear` on reset. Any thread may call anything; the consumer methods
    (:meth:`get`, :meth:`get_with_provenance`, :meth:`qsize`, :meth:`empty`,
    :meth:`get_action_index`, :meth:`peek_provenance`) are lock-free and never wait on a
    producer's merge. Producers serialise among themselves.

    The queue is a sequence of immutable generations; a merge builds the next generation
    while the consumer keeps running, then atomically seals the old one, which fixes the
    exact number of actions consumed before the merge took effect. In append mode no action
    is ever lost or executed twice, and the index only moves forward between merges.

    Args:
        action_dim: Width of one action (``>= 1``).
        rtc: Replace (RTC) mode if true, append mode otherwise.
        capacity: Maximum number of rows the queue may hold (``1 <= capacity < 2**32``).

    Raises:
        ValueError: ``action_dim`` or ``capacity`` out of range.
    """

    def __new__(cls, action_dim: int, *, rtc: bool, capacity: int = 4096) -> ActionQueue: ...
    @property
    def action_dim(self) -> int:
        """Width of one action."""

    @property
    def rtc(self) -> bool:
        """True for replace (RTC) mode, False for append mode."""

    @property
    def capacity(self) -> int:
        """Maximum number of rows the queue may hold."""

    def merge(
        self,
        original: npt.ArrayLike,
        processed: npt.ArrayLike,
        real_delay: int,
        idx_before: int | None = None,
        *,
        provenance: Provenance | None = None,
    ) -> int:
        """Merge a new chunk into the queue (producer side).

        The delay is resolved as in LeRobot: ``delay = max(0, real_delay)``; if
        ``idx_before`` is given, ``consumed = max(0, get_action_index() - idx_before)`` is the
        number of actions executed while the request was in flight, and if it differs from
        ``delay`` the mismatch is counted and ``min(delay, consumed)`` is used (trimming by
        ``real_delay`` alone over-trims when the queue ran dry, making real arms jump). The
        consumer index used is the exact one at the instant the merge takes effect.

        In RTC mode the queue becomes ``chunk[delay:]`` (``delay`` clamped to ``T``); in
        append mode nothing is trimmed. Either way the consumer index resets to 0.

        Releases the GIL while copying. The arrays must not be mutated by another thread
        during the call (the same contract as numpy's own GIL-free copies).

        Args:
            original: Model-space actions, float32, shape ``(T, action_dim)``, ``T >= 1``.
                Any object ``numpy.asarray`` accepts (ndarray, memoryview, buffer); C-contiguous
                arrays are read without an intermediate copy.
            processed: Robot-space actions, same dtype and shape as ``original``.
            real_delay: Steps of inference latency, typically
                ``ceil(latency / dt)`` from a :class:`LatencyTracker`; negative counts as 0.
            idx_before: :meth:`get_action_index` snapshotted when the observation was sent,
                or None to trust ``real_delay``.
            provenance: Carried by every action of this chunk (see :meth:`get_with_provenance`).

        Returns:
            The number of leading steps of the chunk that were trimmed (always 0 in append
            mode).

        Raises:
            QueueError: Wrong dtype, ndim or action dimension, ``T`` mismatch between
                ``original`` and ``processed``, ``T == 0``, or the merge would exceed
                ``capacity`` (RTC: ``T > capacity``; append: unconsumed + ``T`` > capacity).
                Nothing in the queue changes.
        """

    def get(self) -> npt.NDArray[np.float32] | None:
        """Take the next processed action (consumer side, once per control tick).

        Lock-free: never waits on a merge. Keeps the GIL (it copies one row; see the module
        docstring).

        Returns:
            A new float32 array of shape ``(action_dim,)``, or None if the queue is empty.
        """

    def get_with_provenance(
        self,
    ) -> tuple[npt.NDArray[np.float32], Provenance | None] | None:
        """Take the next processed action together with its chunk's provenance.

        Same guarantees as :meth:`get`.

        Returns:
            ``(action, provenance)`` (provenance None if the chunk had none), or None if the
            queue is empty.
        """

    def peek_provenance(self) -> Provenance | None:
        """Provenance of the next action, without consuming it.

        Lock-free; keeps the GIL. Typically called by the control loop to refuse stale
        actions before taking them.

        Returns:
            The provenance, or None if the queue is empty or the chunk had none.
        """

    def qsize(self) -> int:
        """Number of actions left. Lock-free; keeps the GIL."""

    def empty(self) -> bool:
        """Whether no action is left. Lock-free; keeps the GIL."""

    def get_action_index(self) -> int:
        """Actions consumed since the last merge or clear (LeRobot's ``last_index``).

        Snapshot it when sending an observation and pass it back as ``idx_before``.
        Lock-free; keeps the GIL.
        """

    def get_left_over(self) -> npt.NDArray[np.float32] | None:
        """Unconsumed original (model-space) actions, for RTC conditioning of the next request.

        Releases the GIL around the copy; never waits on a merge.

        Returns:
            A new float32 array of shape ``(n, action_dim)`` (``n`` may be 0 once the queue
            is exhausted), or None if nothing was merged since construction or :meth:`clear`.
        """

    def get_processed_left_over(self) -> npt.NDArray[np.float32] | None:
        """Unconsumed processed (robot-space) actions; same contract as :meth:`get_left_over`."""

    def clear(self) -> None:
        """Drop every queued action and reset the index (e.g. at an episode reset).

        Afterwards :meth:`get_left_over` returns None. Producer side; releases the GIL.
        """

    def statistics(self) -> QueueStats:
        """A frozen snapshot of the counters and the current size/index. Never waits."""

# ----------------------------------------------------------------------------- header codec

HEADER_SIZE: Final[int]
"""Size of an encoded header: 30 bytes."""

HEADER_MAGIC: Final[bytes]
"""First two bytes of every header: ``b"SV"``."""

SCHEMA_VERSION: Final[int]
"""The schema version this build writes (1)."""

SUPPORTED_SCHEMA_VERSIONS: Final[frozenset[int]]
"""Every schema version this codec reads and writes: ``{1}``."""

MSG_OBS: Final[int]
"""Message type 1: observation (client to server)."""

MSG_CHUNK: Final[int]
"""Message type 2: action chunk (server to client)."""

MSG_ERROR: Final[int]
"""Message type 3: error reply."""

MSG_DRAIN: Final[int]
"""Message type 4: drain notice (server to client)."""

FLAG_EPISODE_START: Final[int]
"""Flag bit 1: this observation starts a new episode."""

class HeaderError(ValueError):
    """A header could not be built, encoded or decoded.

    The message names the problem, e.g. ``"header is 12 bytes, expected 30"``,
    ``"bad magic b'XX', expected b'SV'"``, ``"unsupported schema_version 7 (supported: 1)"``,
    ``"unknown msg_type 9 (known: 1, 2, 3, 4)"`` or
    ``"flags=256 does not fit u8, expected 0 <= flags <= 255"``.
    """

@final
class Header:
    """The attachment header of every servo message (frozen, hashable).

    Wire layout, packed little-endian, 30 bytes::

        magic b"SV" (2) | schema_version u16 | msg_type u8 | flags u8 | seq_id u64 |
        episode_id u32 | session_epoch u32 | client_mono_ns i64

    Built by whichever task sends a message and decoded by whichever receives it; it has no
    owner and is safe to share between threads. No method releases the GIL (30-byte copies).

    Args:
        schema_version: Wire schema version (u16); :data:`SCHEMA_VERSION` for new messages.
        msg_type: One of the ``MSG_*`` constants (u8).
        flags: Bit set of ``FLAG_*`` constants (u8); unknown bits are carried through.
        seq_id: Request sequence number, echoed in the reply (u64).
        episode_id: Episode counter (u32).
        session_epoch: Session epoch, bumped at every session (re)open (u32).
        client_mono_ns: The client's monotonic clock in ns (i64): an opaque token the server
            echoes back and never compares with its own clock.

    Raises:
        HeaderError: A value does not fit its field's wire type; the message names the field.
            (Unknown ``schema_version``/``msg_type`` values are accepted here and rejected by
            :func:`encode_header`.)
    """

    def __new__(
        cls,
        schema_version: int,
        msg_type: int,
        flags: int,
        seq_id: int,
        episode_id: int,
        session_epoch: int,
        client_mono_ns: int,
    ) -> Header: ...
    @property
    def schema_version(self) -> int:
        """Wire schema version (u16)."""

    @property
    def msg_type(self) -> int:
        """Message type (u8), one of the ``MSG_*`` constants."""

    @property
    def flags(self) -> int:
        """Flag bits (u8)."""

    @property
    def seq_id(self) -> int:
        """Request sequence number (u64)."""

    @property
    def episode_id(self) -> int:
        """Episode counter (u32)."""

    @property
    def session_epoch(self) -> int:
        """Session epoch (u32)."""

    @property
    def client_mono_ns(self) -> int:
        """The client's monotonic clock (ns, i64), opaque to the server."""

    def replace(self, **changes: int) -> Header:
        """A copy with the given fields changed.

        Args:
            **changes: Field names and their new values.

        Returns:
            The new header.

        Raises:
            HeaderError: A value does not fit its field.
            TypeError: An unknown field name.
        """

    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def encode_header(h: Header) -> bytes:
    """Encode a header into its 30-byte wire form. Keeps the GIL (a 30-byte copy).

    Args:
        h: The header.

    Returns:
        Exactly :data:`HEADER_SIZE` bytes.

    Raises:
        HeaderError: ``schema_version`` not in :data:`SUPPORTED_SCHEMA_VERSIONS` or
            ``msg_type`` not a known ``MSG_*`` value.
    """

def decode_header(buf: bytes | bytearray | memoryview) -> Header:
    """Decode a 30-byte header. Keeps the GIL (a 30-byte copy).

    Args:
        buf: Exactly :data:`HEADER_SIZE` bytes (any contiguous or strided byte buffer).

    Returns:
        The header.

    Raises:
        HeaderError: Wrong length, bad magic, unsupported schema version or unknown message
            type, checked in that order.
    """

# ---------------------------------------------------------------------------- latency

@final
class LatencyTracker:
    """Latency samples in nanoseconds on the monotonic clock, over a sliding window.

    Typically fed by the client's request worker (one sample per chunk round trip, measured
    with ``time.monotonic_ns()`` on this host) and read by the same worker to compute
    ``delay_steps = ceil(latency / dt)``; benchmarks read p50/p99/p999 from it. Thread-safe:
    an internal mutex is only ever held for O(1) work or an O(window) copy.

    Args:
        window: Number of most recent samples kept (``>= 1``).

    Raises:
        ValueError: ``window < 1``.
    """

    def __new__(cls, window: int = 100) -> LatencyTracker: ...
    @property
    def window(self) -> int:
        """Number of most recent samples kept."""

    def add(self, ns: int) -> None:
        """Record one sample. O(1) amortized; keeps the GIL.

        Args:
            ns: Latency in nanoseconds.

        Raises:
            ValueError: ``ns`` is negative.
        """

    def max(self) -> int | None:
        """Maximum over the samples currently in the window (None if empty). O(1)."""

    def percentile(self, q: float) -> int | None:
        """Nearest-rank percentile of the window.

        The smallest sample such that at least ``q * n`` of the ``n`` samples are at or
        below it: ``sorted[max(ceil(q * n), 1) - 1]``. ``q=0`` is the minimum, ``q=1`` the
        maximum, and the result is always an observed sample (no interpolation). Releases the
        GIL around the O(window) copy and sort.

        Args:
            q: Quantile in ``[0, 1]`` (e.g. 0.99 for p99).

        Returns:
            The percentile in ns, or None if there is no sample.

        Raises:
            ValueError: ``q`` outside ``[0, 1]`` or NaN.
        """

    def percentiles(self, qs: Sequence[float]) -> list[int] | None:
        """Several nearest-rank percentiles from one sort (see :meth:`percentile`).

        Args:
            qs: Quantiles in ``[0, 1]``.

        Returns:
            One value per quantile, in order, or None if there is no sample.

        Raises:
            ValueError: A quantile outside ``[0, 1]`` or NaN.
        """

    def count(self) -> int:
        """Number of samples currently in the window. O(1)."""

    def reset(self) -> None:
        """Forget every sample."""
