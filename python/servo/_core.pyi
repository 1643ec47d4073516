# This stub is where the public docs of servo._core live (pydantic-core does the same), so
# docstrings are wanted here.
# ruff: noqa: PYI021
"""servo's Rust core: the action chunk queue, the attachment codec, the session cipher, the latency tracker.

Everything here is small and hot; everything else in servo is Python. Five things live here:

* :class:`ActionQueue` -- the chunk buffer between the inference side (producer: ``merge``)
  and the robot control loop (consumer: ``get``). The consumer never waits on a producer, even
  when the two live in different processes (the queue can live in :class:`SharedMemory`).
* :class:`SharedMemory` and its lock-free views (:class:`Seqlock`, :class:`Ring`,
  :class:`Counters`) -- what the edge's control process and its main process share besides
  the queue: the newest observation, commands, counters and the recorder feed.
* The attachment codec (:class:`Header`, :func:`decode_header`) -- every message carries a
  fixed 62-byte Zenoh attachment: a 46-byte packed little-endian header followed by a 16-byte
  tag, so routing and correlation never deserialise a message body.
* The session cipher and identities (:class:`SessionKey`, :class:`KeyPair`,
  :class:`ServerIdentity`) -- every body of a session encrypted with AES-256-GCM (the header
  as associated data, the tag in the attachment), the X25519 exchange that gives both ends of
  a session their keys without sending them, and the Ed25519 identity edges pin servers by.
* :class:`LatencyTracker` -- monotonic-clock latency samples with a sliding window.

GIL policy: calls that copy O(chunk) or O(window) data release the GIL around the copy
(``ActionQueue.merge``, ``get_left_over``, ``get_processed_left_over``,
``LatencyTracker.percentile(s)``), and :meth:`SessionKey.encrypt`/:meth:`SessionKey.decrypt`
release it while going over a body of 64 KiB or more. Per-tick calls (``ActionQueue.get`` and
friends, the header codec, encrypting or decrypting a small body, ``LatencyTracker.add``, every
:class:`SharedMemory` view) take at most a few µs and
never wait, so they keep the GIL: releasing it would let another Python thread take it, and
the caller would then wait up to ``sys.getswitchinterval()`` (5 ms by default) to get it back.

Buffers handed to a call that releases the GIL must not be mutated by another thread during
the call (the same contract as numpy's own GIL-free copies).
"""

from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal, SupportsBytes, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

# servo's own error classes (`servo.errors`), raised here
from servo.errors import AuthError as AuthError
from servo.errors import HeaderError as HeaderError
from servo.errors import QueueError as QueueError

__all__ = [
    "ATTACHMENT_SIZE",
    "FLAG_COPY",
    "FLAG_EPISODE_START",
    "HEADER_MAGIC",
    "HEADER_SIZE",
    "KEY_SIZE",
    "MSG_CHUNK",
    "MSG_CONTROL",
    "MSG_CONTROL_ACK",
    "MSG_DRAIN",
    "MSG_ERROR",
    "MSG_OBS",
    "PUBLIC_KEY_SIZE",
    "SCHEMA_VERSION",
    "SEED_SIZE",
    "SESSION_ID_SIZE",
    "SIGNATURE_SIZE",
    "SUPPORTED_SCHEMA_VERSIONS",
    "TAG_SIZE",
    "ActionQueue",
    "AuthError",
    "Counters",
    "Header",
    "HeaderError",
    "KeyPair",
    "LatencyTracker",
    "Provenance",
    "QueueError",
    "QueueStats",
    "Ring",
    "Seqlock",
    "ServerIdentity",
    "SessionKey",
    "SharedMemory",
    "__version__",
    "build_profile",
    "decode_header",
    "exchange_public_key",
    "unauthenticated",
    "verify_signature",
]

__version__: Final[str]
"""Version of the servo-core crate this module was built from."""

build_profile: Final[Literal["release", "debug"]]
"""Cargo profile of this build; benchmarks refuse to measure a ``"debug"`` build."""

# ----------------------------------------------------------------------------- ActionQueue

@final
class Provenance:
    """Where an action comes from: its chunk, and the control step it is meant for; a frozen, tuple-like record.

    Every action of a merged chunk carries its chunk's provenance, so the edge can refuse
    actions older than its staleness bound and datasets can be joined with server logs; each
    carries its own ``step`` (the chunk's plus the action's index in it), so a recording shows
    which control step every executed action was meant for. Iterating, indexing and ``len``
    behave like the tuple ``(session_id, seq_id, episode_id, obs_mono_ns, step)``; instances are
    hashable, and ``__reduce__`` rebuilds one from that tuple (``copy``, multiprocessing within one
    host). No servo wire format carries Python objects: messages are typed msgpack.

    The session id is the wire's 16-byte id; in Python it is its 32-character lowercase hex text
    (``bytes.hex()``), as in logs, audit lines, recordings and summaries. Any case is accepted.

    Args:
        session_id: Session the chunk was produced for (32 hex characters).

    Raises:
        ValueError: ``session_id`` is not 32 hexadecimal characters.
        seq_id: Sequence number of the request the chunk answers.
        episode_id: Episode the chunk belongs to.
        obs_mono_ns: Monotonic time (ns, this host's clock) at which the observation the
            chunk answers was taken.
        step: The control step (tick) the action is meant for; given to a merge, the tick of
            the observation the chunk answers (each merged row gets it plus its index).
    """

    __match_args__: Final = ("session_id", "seq_id", "episode_id", "obs_mono_ns", "step")

    def __new__(cls, session_id: str, seq_id: int, episode_id: int, obs_mono_ns: int, step: int = 0) -> Provenance: ...
    @property
    def session_id(self) -> str:
        """Session the chunk was produced for: 32 lowercase hex characters (16 bytes)."""

    @property
    def seq_id(self) -> int:
        """Sequence number of the request the chunk answers (u64)."""

    @property
    def episode_id(self) -> int:
        """Episode the chunk belongs to (u64)."""

    @property
    def obs_mono_ns(self) -> int:
        """Monotonic time (ns) of the observation the chunk answers (i64)."""

    @property
    def step(self) -> int:
        """The control step (tick) the action is meant for (u64)."""

    def same_chunk(self, other: Provenance) -> bool:
        """Whether both label actions of one chunk (every field but ``step``)."""

    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: Any, /) -> Any: ...
    def __iter__(self) -> Iterator[str | int]: ...
    def __reduce__(self) -> tuple[type[Provenance], tuple[str, int, int, int, int]]: ...

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
        """Merges whose actions taken (since ``idx_before`` or ``since``) disagreed with ``real_delay``."""

    @property
    def actions_consumed(self) -> int:
        """Actions handed out by ``get``/``get_with_provenance`` since construction."""

    @property
    def superseded_reads(self) -> int:
        """Gets that took the current action instead of a row replaced while it was being copied.

        A row is only overwritten after two later merges, so this needs a consumer stalled in the
        middle of a get.
        """

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

    ``merge(..., since=position)`` is the exact merge: ``position`` is :meth:`get_position`
    read when the observation was taken, row ``r`` of the chunk is meant for the step ``r``
    after the observation's, and the chunk continues exactly where the queue's own actions end
    (RTC: minus the actions taken since ``position``; append: behind the queued actions, minus
    the rows whose steps were taken or are queued). No step is executed twice, however late
    the chunk comes.

    Threads and processes: one control loop (the consumer) calls :meth:`get` once per tick;
    the inference side (the producer: a worker thread or the event loop's chunk handler) calls
    :meth:`merge`, :meth:`get_action_index` and :meth:`get_left_over` when it sends a
    request, and :meth:`clear` on reset; the control loop reads :meth:`get_position` with each
    observation. Any thread of any process that maps the queue may call
    anything; every method but :meth:`merge` and :meth:`set_rtc` is lock-free and never waits
    on a producer, even one stopped in the middle of a merge. Producers serialise among
    themselves on a lock word in the queue's memory.

    ``ActionQueue(...)`` lives in private memory; :meth:`create` writes one into a
    :class:`SharedMemory` that another process maps (:meth:`SharedMemory.attach`) and opens
    with :meth:`attach`. The memory holds fixed-size words only (a ring of ``2 * capacity``
    rows, no pointers). A merge writes the new rows next to the queued ones, then atomically
    seals the live generation, which fixes the exact number of actions consumed before the
    merge took effect. In append mode no action is ever lost or executed twice, and the index
    only moves forward between merges.

    Args:
        action_dim: Width of one action (``1 <= action_dim <= 65536``).
        rtc: Replace (RTC) mode if true, append mode otherwise.
        capacity: Maximum number of rows the queue may hold (``1 <= capacity <= 2**24 - 1``).

    Raises:
        ValueError: ``action_dim`` or ``capacity`` out of range.
    """

    def __new__(cls, action_dim: int, *, rtc: bool, capacity: int = 4096) -> ActionQueue: ...
    @staticmethod
    def shared_size(action_dim: int, capacity: int = 4096) -> int:
        """Bytes of :class:`SharedMemory` a queue of these dimensions occupies.

        Raises:
            ValueError: ``action_dim`` or ``capacity`` out of range.
        """

    @staticmethod
    def create(memory: SharedMemory, offset: int, action_dim: int, *, rtc: bool, capacity: int = 4096) -> ActionQueue:
        """An empty queue written into ``memory`` at byte ``offset`` (a multiple of 8).

        The region (:meth:`shared_size` bytes) is overwritten. Other processes open the same
        queue with :meth:`attach`.

        Raises:
            ValueError: dimensions out of range, or the region does not fit in ``memory``.
        """

    @staticmethod
    def attach(memory: SharedMemory, offset: int) -> ActionQueue:
        """The queue :meth:`create` wrote into ``memory`` at byte ``offset``.

        Raises:
            ValueError: no queue there (bad magic), or it does not fit in ``memory``.
        """

    @property
    def action_dim(self) -> int:
        """Width of one action."""

    @property
    def rtc(self) -> bool:
        """True for replace (RTC) mode, False for append mode."""

    def set_rtc(self, rtc: bool) -> None:
        """Switch between replace (RTC) and append merging from the next merge on (producer side)."""

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
        since: int | None = None,
    ) -> int:
        """Merge a new chunk into the queue (producer side).

        With ``since``, the exact merge (see the class docstring): the actions taken since that
        position are counted at the instant the merge takes effect; ``real_delay`` only counts
        a mismatch. RTC trims exactly those; append leaves out the chunk's rows whose steps were
        taken or are still queued. A queue that ran dry meanwhile skips nothing for the ticks
        without an action, and a clear keeps the actions taken before it counted.

        Otherwise the delay is resolved as in LeRobot: ``delay = max(0, real_delay)``; if
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
            provenance: Carried by every action of this chunk (see :meth:`get_with_provenance`),
                each with its own ``step``: ``provenance.step`` plus its index in the chunk.
            since: :meth:`get_position` read when the observation was taken (exact merge).

        Returns:
            The number of leading steps of the chunk that were trimmed (always 0 in append
            mode), or with ``since`` left out.

        Raises:
            ValueError: both ``idx_before`` and ``since`` given.
            QueueError: Wrong dtype, ndim or action dimension, ``T`` mismatch between
                ``original`` and ``processed``, ``T == 0``, the merge would exceed
                ``capacity`` (RTC: ``T > capacity``; append: unconsumed + ``T`` > capacity), or
                ``since`` was read before the last merge (:meth:`is_current`). Nothing in the
                queue changes.
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

    def get_position(self) -> int:
        """Where the consumer stands (an opaque integer): read it with each observation.

        The live generation and the actions taken from it (a clear keeps the count). Pass it
        as ``since`` to :meth:`merge` and :meth:`get_left_over`. Lock-free; keeps the GIL.
        """

    def is_current(self, position: int) -> bool:
        """Whether ``position`` was read since the last merge, so a merge can measure from it.

        Lock-free; keeps the GIL.
        """

    def get_left_over(self, since: int | None = None) -> npt.NDArray[np.float32] | None:
        """Unconsumed original (model-space) actions, for RTC conditioning of the next request.

        With ``since`` (a :meth:`get_position`), the actions from that position on, those taken
        since included: the plan an observation taken there was made under. Releases the GIL
        around the copy; never waits on a merge.

        Returns:
            A new float32 array of shape ``(n, action_dim)`` (``n`` may be 0 once the queue
            is exhausted), or None if nothing was merged since construction or :meth:`clear`.

        Raises:
            QueueError: ``since`` was read before the last merge (:meth:`is_current`).
        """

    def get_processed_left_over(self, since: int | None = None) -> npt.NDArray[np.float32] | None:
        """Unconsumed processed (robot-space) actions; same contract as :meth:`get_left_over`."""

    def clear(self) -> None:
        """Drop every queued action and reset :meth:`get_action_index` (e.g. at an episode reset).

        Afterwards :meth:`get_left_over` returns None. Lock-free (one atomic step, so a consumer
        may call it too); keeps the GIL. A merge that was in progress takes effect after it.
        """

    def discard_chunk(self, provenance: Provenance | None) -> bool:
        """Clear the queue only while its next action still belongs to ``provenance``'s chunk.

        Also clears when the next action is unlabeled or the queue is empty; a chunk merged
        since (whose actions lead now) survives. The staleness bound's "the rest of a stale
        chunk is stale too". Lock-free; keeps the GIL.

        Returns:
            True if this call cleared the queue.
        """

    def statistics(self) -> QueueStats:
        """A frozen snapshot of the counters and the current size/index. Never waits."""

# ----------------------------------------------------------------------------- shared memory

@final
class SharedMemory:
    """Zeroed memory that several processes map: a Linux memfd, shared by its file descriptor.

    ``SharedMemory(size)`` creates it; a child process receives :meth:`fileno` (e.g. through
    ``subprocess.Popen(pass_fds=...)``) and maps the same bytes with :meth:`attach`. The memory
    has no name in any file system and is gone once no process maps it. ``shared=False`` gives
    private memory with the same views (for a control loop that runs on a thread).

    Everything in it is read and written as atomic 64-bit words through the views below
    (:class:`Seqlock`, :class:`Ring`, :class:`Counters`, :class:`ActionQueue`), whose offsets
    (multiples of 8) the caller lays out; a view is checked against the size when made.

    Args:
        size: Bytes (rounded up to whole words).
        shared: A memfd mapping (Linux) if true, private heap memory otherwise.

    Raises:
        ValueError: ``size`` is 0, or shared memory is not supported on this system.
        OSError: the kernel refused the memfd or the mapping.
    """

    def __new__(cls, size: int, *, shared: bool = True) -> SharedMemory: ...
    @staticmethod
    def attach(fd: int) -> SharedMemory:
        """Map the shared memory behind ``fd`` (the caller keeps its descriptor; this duplicates it).

        Raises:
            OSError: ``fd`` is not an open descriptor, or it cannot be mapped.
            ValueError: its size is not a positive multiple of 8.
        """

    def fileno(self) -> int:
        """The descriptor another process needs (close-on-exec: pass it explicitly).

        Raises:
            ValueError: the memory is private.
        """

    @property
    def size(self) -> int:
        """Size in bytes."""

    @property
    def shared(self) -> bool:
        """Whether other processes can map it."""

    def seqlock(self, offset: int, payload_bytes: int) -> Seqlock:
        """A :class:`Seqlock` of ``payload_bytes`` at byte ``offset`` (:meth:`Seqlock.size` bytes).

        Raises:
            ValueError: misaligned offset, or the region does not fit.
        """

    def ring(self, offset: int, record_bytes: int, capacity: int) -> Ring:
        """A :class:`Ring` of ``capacity`` records at byte ``offset`` (:meth:`Ring.size` bytes).

        Raises:
            ValueError: misaligned offset, empty records or ring, or the region does not fit.
        """

    def counters(self, offset: int, count: int) -> Counters:
        """``count`` :class:`Counters` at byte ``offset``.

        Raises:
            ValueError: misaligned offset, or the region does not fit.
        """

@final
class Seqlock:
    """A newest-wins record in :class:`SharedMemory`: one writer, any number of readers.

    The writer never waits and never sees the readers; a reader gets a consistent copy of the
    newest record, or None while a write is in progress (it decides itself whether to try
    again). One writer at a time: callers serialise writers (one process writes).
    """

    @staticmethod
    def size(payload_bytes: int) -> int:
        """Bytes a seqlock with ``payload_bytes`` of payload occupies."""

    @property
    def payload_bytes(self) -> int:
        """Payload size in bytes."""

    def write(self, data: Buffer) -> None:
        """Replace the record with ``data`` (zero-padded to the payload size).

        Raises:
            ValueError: ``data`` is longer than the payload.
        """

    def read(self, attempts: int = 1) -> bytes | None:
        """A consistent copy of the record (``payload_bytes`` long), or None.

        None when every one of ``attempts`` tries raced a write. A record never written reads
        as zeros (check :attr:`version`).
        """

    @property
    def version(self) -> int:
        """Number of completed writes (0: never written)."""

@final
class Ring:
    """A single-producer single-consumer ring of fixed-size records in :class:`SharedMemory`.

    The producer never waits: a push into a full ring is dropped and counted. One producer and
    one consumer (each may be in its own process).
    """

    @staticmethod
    def size(record_bytes: int, capacity: int) -> int:
        """Bytes a ring of ``capacity`` records of ``record_bytes`` occupies."""

    @property
    def record_bytes(self) -> int:
        """Size of one record in bytes."""

    @property
    def capacity(self) -> int:
        """Number of slots."""

    def push(self, data: Buffer) -> bool:
        """Producer: append ``data`` (zero-padded); False, and counted, when the ring is full.

        Raises:
            ValueError: ``data`` is longer than a record.
        """

    def pop(self) -> bytes | None:
        """Consumer: the oldest record (``record_bytes`` long), or None when the ring is empty."""

    def __len__(self) -> int: ...
    @property
    def dropped(self) -> int:
        """Records dropped because the ring was full."""

@final
class Counters:
    """Unsigned 64-bit counters and flags in :class:`SharedMemory` (atomic, any process).

    ``get`` acquires and ``set``/``add``/``max``/``swap`` release, so a flag set after writing
    other memory publishes that memory to whoever reads the flag.

    Raises:
        IndexError: from every method, for an index out of range.
    """

    @staticmethod
    def size(count: int) -> int:
        """Bytes ``count`` counters occupy."""

    def __len__(self) -> int: ...
    def get(self, index: int) -> int:
        """Current value."""

    def set(self, index: int, value: int) -> None:
        """Store ``value``."""

    def add(self, index: int, delta: int = 1) -> int:
        """Add ``delta`` (wrapping); returns the new value."""

    def max(self, index: int, value: int) -> int:
        """Raise to at least ``value``; returns the new value."""

    def swap(self, index: int, value: int) -> int:
        """Store ``value``; returns the previous one."""

    def read(self, start: int = 0, count: int | None = None) -> npt.NDArray[np.uint64]:
        """A copy of ``count`` counters from ``start`` (each read atomically, not all at once)."""

# ----------------------------------------------------------------------------- header codec

HEADER_SIZE: Final[int]
"""Size of an encoded header: 46 bytes."""

TAG_SIZE: Final[int]
"""Size of the tag (AES-256-GCM) that follows the header in an attachment: 16 bytes."""

ATTACHMENT_SIZE: Final[int]
"""Size of every attachment on the wire, header || tag: 62 bytes."""

SESSION_ID_SIZE: Final[int]
"""Size of a session id: 16 bytes (a random 128-bit id)."""

HEADER_MAGIC: Final[bytes]
"""First two bytes of every header: ``b"SV"``."""

SCHEMA_VERSION: Final[int]
"""The schema version this build writes (3: session bodies encrypted)."""

SUPPORTED_SCHEMA_VERSIONS: Final[frozenset[int]]
"""Every schema version this codec reads and writes: ``{3}`` (versions 1 and 2 are refused)."""

MSG_OBS: Final[int]
"""Message type 1: observation (client to server)."""

MSG_CHUNK: Final[int]
"""Message type 2: action chunk (server to client)."""

MSG_ERROR: Final[int]
"""Message type 3: error reply."""

MSG_DRAIN: Final[int]
"""Message type 4: drain notice (server to client)."""

MSG_CONTROL: Final[int]
"""Message type 5: control request (client to server: reset, close), encrypted like the data plane."""

MSG_CONTROL_ACK: Final[int]
"""Message type 6: answer to a control request (server to client)."""

FLAG_EPISODE_START: Final[int]
"""Flag bit 1: this observation starts a new episode."""

FLAG_COPY: Final[int]
"""Flag bit 2: this observation is a copy of the request in flight, sent again under the next
seq_id because its answer is overdue; a server that still holds, serves or has answered the
original answers the copy from that instead of running another forward."""

@final
class Header:
    """The attachment header of every servo message (frozen, hashable).

    Wire layout, packed little-endian, 46 bytes::

        magic b"SV" (2) | schema_version u16 | msg_type u8 | flags u8 | seq_id u64 |
        episode_id u32 | session_epoch u32 | client_mono_ns i64 | session_id (16 bytes)

    On the wire it is always followed by a 16-byte tag (see :meth:`SessionKey.encrypt` and
    :func:`unauthenticated`). Built by whichever task sends a message and decoded by whichever
    receives it; it has no owner and is safe to share between threads. No method releases the
    GIL (copies of at most 62 bytes).

    Args:
        schema_version: Wire schema version (u16); :data:`SCHEMA_VERSION` for new messages.
        msg_type: One of the ``MSG_*`` constants (u8).
        flags: Bit set of ``FLAG_*`` constants (u8); unknown bits are carried through.
        seq_id: Request sequence number, echoed in the reply (u64).
        episode_id: Episode counter (u32).
        session_epoch: Session epoch, bumped at every session (re)open (u32).
        client_mono_ns: The client's monotonic clock in ns (i64): an opaque token the server
            echoes back and never compares with its own clock.
        session_id: The session the message belongs to: exactly :data:`SESSION_ID_SIZE`
            opaque bytes (all zero outside a session).

    Raises:
        HeaderError: A value does not fit its field's wire type, or ``session_id`` is not 16
            bytes; the message names the field. (Unknown ``schema_version``/``msg_type`` values
            are accepted here and rejected when the header is encrypted.)
        TypeError: A field of the wrong type (e.g. a ``session_id`` that is not ``bytes``).
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
        session_id: bytes,
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

    @property
    def session_id(self) -> bytes:
        """The session id (16 bytes)."""

    def replace(self, **changes: int | bytes) -> Header:
        """A copy with the given fields changed.

        Args:
            **changes: Field names and their new values.

        Returns:
            The new header.

        Raises:
            HeaderError: A value does not fit its field.
            TypeError: An unknown field name or a value of the wrong type.
        """

    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def decode_header(attachment: Buffer) -> Header:
    """Decode the header of an attachment WITHOUT checking its tag (a routing peek).

    Use it to find the session (and so the key) a message claims; trust nothing in the result
    until :meth:`SessionKey.decrypt` has verified the tag. Keeps the GIL (a 62-byte copy).

    Args:
        attachment: Exactly :data:`ATTACHMENT_SIZE` bytes (any C-contiguous buffer).

    Returns:
        The header.

    Raises:
        HeaderError: Wrong length, bad magic, unsupported schema version or unknown message
            type, checked in that order.
    """

# ----------------------------------------------------------------------------- authentication

KEY_SIZE: Final[int]
"""Size of a session secret (and of each key derived from it): 32 bytes."""

PUBLIC_KEY_SIZE: Final[int]
"""Size of an X25519 or Ed25519 public key: 32 bytes."""

SEED_SIZE: Final[int]
"""Size of an Ed25519 seed (:attr:`ServerIdentity.seed`): 32 bytes."""

SIGNATURE_SIZE: Final[int]
"""Size of an Ed25519 signature: 64 bytes."""

@final
class SessionKey:
    """One end's keys of a session: encrypts what this end sends, decrypts what the other sends (frozen).

    Each direction has its own AES-256-GCM key, derived from the session secret with BLAKE3
    ``derive_key`` (contexts ``"servo 2026-11 session client-to-server aes-256-gcm v3"`` and
    ``"… server-to-client …"``). A message is its header (in the clear, the associated data),
    the encrypted body, and the 16-byte GCM tag after the header in the attachment. The nonce
    is ``msg_type || 0 0 0 || seq_id`` (little-endian), rebuilt by the receiver from the
    header; this key refuses to encrypt a seq_id that is not above the last one it encrypted
    for that message type, so a nonce never repeats under one key. A client encrypts
    observations and control requests, a server chunks, errors, drain notices and control
    acks; each decrypts only what the other end sends, so a reflected message never verifies.

    Made by :meth:`KeyPair.session_key` (or from a raw secret), then owned by the session; safe
    to share between threads (the nonce guard is atomic). Never copy one: two objects over one
    secret would each start their nonce guard afresh. Its ``repr`` never shows the key.

    GIL: released while going over a body of 64 KiB or more (an observation), kept below (a
    chunk takes ~1-3 µs, less than a GIL round trip can cost). A buffer must not be mutated by
    another thread during the call.

    Args:
        secret: The session secret, exactly :data:`KEY_SIZE` bytes.
        role: ``"client"`` or ``"server"``: which end this key is.

    Raises:
        AuthError: ``secret`` is not 32 bytes.
        ValueError: ``role`` is neither ``"client"`` nor ``"server"``.
    """

    def __new__(cls, secret: bytes, *, role: Literal["client", "server"]) -> SessionKey: ...
    @property
    def role(self) -> Literal["client", "server"]:
        """Which end of the session this key is."""

    def encrypt(self, header: Header, body: Buffer | list[Buffer] | tuple[Buffer, ...]) -> tuple[bytes, bytes]:
        """Encrypt ``body`` under ``header``: ``(attachment, ciphertext)`` to send.

        One pass copies the body into a new ``bytes`` and encrypts it there (the buffer
        Zenoh sends); the tag covers the header and the ciphertext.

        Args:
            header: The header: a message type this end sends, and a ``seq_id`` above the last
                one this key encrypted for that type.
            body: The message body: one C-contiguous buffer (bytes, bytearray, memoryview,
                numpy array of any dtype) or a list or tuple of them, encrypted as their
                concatenation.

        Returns:
            The attachment (exactly :data:`ATTACHMENT_SIZE` bytes: header || tag) and the
            ciphertext (as long as the body).

        Raises:
            AuthError: A message type the other end sends, or a ``seq_id`` not above the last
                one of its type (its nonce would repeat); nothing is encrypted then.
            HeaderError: ``schema_version`` not in :data:`SUPPORTED_SCHEMA_VERSIONS` or
                ``msg_type`` not a known ``MSG_*`` value.
            TypeError: ``body`` (or one of its parts) is not a buffer.
            BufferError: A part is not C-contiguous (numpy raises ``ValueError``).
        """

    def encrypt_in_place(self, header: Header, buffer: Buffer) -> bytes:
        """Encrypt the body held in ``buffer`` where it lies; return the attachment.

        For a sender that encodes each message into one buffer it reuses (a ``bytearray``
        filled by msgspec's ``encode_into``): no new buffer, one pass. ``buffer`` is left
        untouched when the call raises.

        Args:
            header: As for :meth:`encrypt`.
            buffer: A writable C-contiguous buffer holding the body.

        Returns:
            The attachment (exactly :data:`ATTACHMENT_SIZE` bytes: header || tag).

        Raises:
            AuthError: As for :meth:`encrypt`.
            HeaderError: As for :meth:`encrypt`.
            BufferError: ``buffer`` is read-only (``bytes``) or not C-contiguous.
            TypeError: ``buffer`` is not a buffer.
        """

    def decrypt(self, attachment: Buffer, ciphertext: Buffer | SupportsBytes) -> tuple[Header, bytes]:
        """Verify a message from the other end and decrypt it: ``(header, body)``.

        Checks, in order: the attachment's length, the zero tag of :func:`unauthenticated`
        (always refused), the tag (by the AEAD, in constant time), the header. Nothing is
        decoded or returned before the tag verifies, so any bit changed in header, ciphertext
        or tag gives ``"tag mismatch"``. Replays are the caller's to refuse (by ``seq_id``).

        Args:
            attachment: The received attachment (any C-contiguous buffer).
            ciphertext: The received body: a buffer (copied into the new plaintext), or an
                object without the buffer protocol that ``bytes()`` converts (a Zenoh
                ``ZBytes``): its bytes are made once and, when this call holds the only
                reference to them, decrypted where they lie (the copy out of Zenoh is the only
                one).

        Returns:
            The authenticated header and the plaintext body (a ``bytes`` nobody else holds).

        Raises:
            AuthError: Wrong length, zero tag or tag mismatch.
            HeaderError: The tag is valid but the header does not decode (a key holder sent
                a header of another schema).
            TypeError: ``attachment`` is not a buffer, or ``ciphertext`` is neither a buffer
                nor convertible by ``bytes()``.
        """

    def authenticate(self, header: Header, data: Buffer | list[Buffer] | tuple[Buffer, ...]) -> bytes:
        """A proof that this end holds the session's keys, over ``data`` that does not travel.

        For data both ends know (a resume proof binds a new open's key): ``header`` followed by
        keyed BLAKE3 of header || data under this end's proof key, truncated to 16 bytes.
        Nothing is encrypted and no nonce is used.

        Returns:
            Exactly :data:`ATTACHMENT_SIZE` bytes.

        Raises:
            AuthError: A message type the other end sends.
            HeaderError: ``schema_version`` or ``msg_type`` unknown.
            TypeError: ``data`` (or one of its parts) is not a buffer.
        """

    def verify(self, attachment: Buffer, data: Buffer | list[Buffer] | tuple[Buffer, ...]) -> Header:
        """Check the other end's :meth:`authenticate` proof over ``data``, then decode its header.

        Checks, in order: the length, the zero tag (always refused), the tag (constant-time
        comparison), the header.

        Returns:
            The authenticated header.

        Raises:
            AuthError: Wrong length, zero tag or tag mismatch.
            HeaderError: The tag is valid but the header does not decode.
            TypeError: ``attachment`` or ``data`` is not a buffer.
        """

def unauthenticated(header: Header) -> bytes:
    """The attachment of a keyless notice: the encoded header followed by 16 zero bytes.

    For the few messages sent without a session key (e.g. "unknown session"). A receiver can
    :func:`decode_header` it but :meth:`SessionKey.decrypt` and :meth:`SessionKey.verify`
    always refuse it. Keeps the GIL.

    Returns:
        Exactly :data:`ATTACHMENT_SIZE` bytes.

    Raises:
        HeaderError: ``schema_version`` or ``msg_type`` unknown.
    """

@final
class KeyPair:
    """An ephemeral X25519 key pair for one session-key exchange (frozen; single use).

    Both ends make one per session open and send only :attr:`public_key`; each then calls
    :meth:`session_key` with the other's public key, and both get their end of the same
    session: the secret is BLAKE3 ``derive_key("servo 2026-11 session key v3", shared secret ||
    client_public || server_public || session_id)``. The secret is drawn from the OS random
    number generator, never leaves Rust and is wiped once used. Owned by the task running the
    exchange; safe to share between threads. Keeps the GIL (~0.1 ms to make a pair and ~0.1 ms
    per exchange, once per session).

    Raises:
        OSError: The OS random number generator failed.
    """

    def __new__(cls) -> KeyPair: ...
    @property
    def public_key(self) -> bytes:
        """This pair's public key (32 bytes), to send to the peer."""

    def session_key(
        self,
        peer_public: bytes,
        *,
        client_public: bytes,
        server_public: bytes,
        session_id: bytes,
    ) -> SessionKey:
        """Derive this end's key of the session shared with ``peer_public``; uses the pair up.

        Args:
            peer_public: The other end's public key (32 bytes).
            client_public: The client's public key (32 bytes); this pair's or the peer's.
            server_public: The server's public key (32 bytes); the other one.
            session_id: The session the key is for (16 bytes); a different id gives a
                different key.

        Returns:
            This end's :class:`SessionKey`: role ``"client"`` if this pair's public key is
            ``client_public``, else ``"server"``.

        Raises:
            AuthError: A wrong length or ``client_public``/``server_public`` that are not this
                pair's and the peer's public keys (the pair stays usable); a low-order peer key,
                i.e. an all-zero shared secret (the pair is used up); or the pair was already
                used.
        """

@final
class ServerIdentity:
    """A server's long-lived Ed25519 signing identity (frozen).

    Edges pin the :attr:`public_key` of the servers they trust and check what a server
    signs with :func:`verify_signature`. Owned by the server process (saved as its
    :attr:`seed`); safe to share between threads. Signing keeps the GIL (~20 µs plus hashing
    the message). Its ``repr`` shows the public key only.
    """

    @staticmethod
    def generate() -> ServerIdentity:
        """A new identity from the OS random number generator.

        Raises:
            OSError: The OS random number generator failed.
        """

    @staticmethod
    def from_seed(seed: bytes) -> ServerIdentity:
        """The identity saved as ``seed``.

        Args:
            seed: Exactly :data:`SEED_SIZE` bytes, as returned by :attr:`seed`.

        Raises:
            AuthError: ``seed`` is not 32 bytes.
        """

    @property
    def seed(self) -> bytes:
        """The secret seed (32 bytes), to save the identity; keep it private."""

    @property
    def public_key(self) -> bytes:
        """The public key edges pin (32 bytes)."""

    def sign(self, message: Buffer) -> bytes:
        """Sign ``message`` (deterministic Ed25519, RFC 8032).

        Args:
            message: Any C-contiguous buffer.

        Returns:
            The signature (:data:`SIGNATURE_SIZE` bytes).
        """

    @property
    def exchange_public_key(self) -> bytes:
        """This identity's X25519 public key (see :func:`exchange_public_key`)."""

    def session_key(
        self,
        peer_public: bytes,
        *,
        client_public: bytes,
        server_public: bytes,
        session_id: bytes,
    ) -> SessionKey:
        """This identity's end of a session with the holder of the ephemeral key ``peer_public``.

        Exchanged with the X25519 form of this identity's secret (RFC 8032's secret scalar, as
        libsodium's ``crypto_sign_ed25519_sk_to_curve25519``), so a sender who knows only the
        identity can encrypt to it: its own :class:`KeyPair`, ``server_public`` =
        :func:`exchange_public_key` of the identity. The same key serving both signatures and
        this exchange is analysed in "On using the same key pair for Ed25519 and an X25519 based
        KEM" (Thormarker, 2021). Arguments and errors as :meth:`KeyPair.session_key`; the
        identity is not used up. Keeps the GIL (~0.1 ms).
        """

def exchange_public_key(public_key: bytes) -> bytes:
    """The X25519 public key of the identity whose Ed25519 public key is ``public_key``.

    Its Montgomery form (libsodium's ``crypto_sign_ed25519_pk_to_curve25519``): what a record is
    encrypted to when its reader is known only by its identity (:meth:`ServerIdentity.session_key`
    is the reader's end). Keeps the GIL (~20 µs).

    Raises:
        AuthError: ``public_key`` is not 32 bytes, or not an Ed25519 public key.
    """

def verify_signature(public_key: bytes, message: Buffer, signature: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s Ed25519 signature of ``message``.

    Strict RFC 8032 verification (no malleable signatures, no small-order keys). A public key
    that is not a valid point, or any other garbage of the right length, gives False. Keeps
    the GIL (~80 µs plus hashing the message).

    Args:
        public_key: The pinned public key (32 bytes).
        message: The signed bytes (any C-contiguous buffer).
        signature: The signature (64 bytes).

    Returns:
        True if the signature is valid.

    Raises:
        AuthError: ``public_key`` is not 32 bytes or ``signature`` not 64.
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
