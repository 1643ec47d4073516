"""The link between a server and its policy process: typed msgpack messages and raw numpy arrays.

One message on the stream is ``<u32 header length><u64 body length><u8 where>``, a msgpack
header (one of `Message`) and a body holding the header's arrays back to back, in the order their
`ArrayRef` appear. A small body follows on the stream (sent from the arrays' own buffers); a
large one (frames) is in the sender's arena (`servo.policy.arena`: shared memory whose descriptor
rides with the first message that needs it). Either way it is received into one buffer per
message of the receiver's own.

The two ends are the halves of an anonymous ``socketpair`` the child inherits: no path on disk,
no port, nothing another process can connect to. Both ends are servo's own code; the sizes are
still checked, so a broken peer gives a clear error instead of a huge allocation.
"""

from __future__ import annotations

import array
import contextlib
import math
import mmap
import os
import select
import socket
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from servo.errors import PolicyError
from servo.logs import get_logger
from servo.policy import arena as _arena
from servo.policy.protocol import DecodedObservation, PolicySpec
from servo.policy.runner import DType

log = get_logger(__name__)

_PREFIX = struct.Struct("<IQB")
#: Where a message's body is: on the stream after the header, or in the sender's arena.
_ON_STREAM, _IN_ARENA = 0, 1
#: Headers carry names, shapes and error messages: far below this.
MAX_HEADER_BYTES = 16 << 20
#: A batch of observations with several full-HD cameras fits many times over.
MAX_BODY_BYTES = 8 << 30
#: Send and receive buffer asked of the kernel for each end.
SOCKET_BUFFER_BYTES = 4 << 20
#: Frames and float vectors (state, prefixes, chunks): all the link carries.
_DTYPES = frozenset({"uint8", "float32"})


class ChannelClosed(PolicyError, ConnectionError):
    """The other end closed the link or exited."""


class ArrayRef(msgspec.Struct, array_like=True, frozen=True):
    """An array of the message body: its dtype and shape (its size follows from them)."""

    dtype: str
    shape: tuple[Annotated[int, msgspec.Meta(ge=0)], ...]

    @property
    def nbytes(self) -> int:
        """Bytes it takes in the body."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


class Load(msgspec.Struct, tag=True, frozen=True):
    """Load the policy and make its runner (`servo.server.manifest.ModelSection`'s fields)."""

    source: str
    options: dict[str, Any]
    device: str
    dtype: DType
    compile: bool
    cuda_graphs: bool
    search_path: str | None


class Warmup(msgspec.Struct, tag=True, frozen=True):
    """`InferenceRunner.warmup`."""

    count: int
    batch_sizes: list[int]


class Timed(msgspec.Struct, tag=True, frozen=True):
    """`InferenceRunner.timed_forwards`."""

    count: int


class Request(msgspec.Struct, array_like=True, frozen=True):
    """One session's observation to serve with its processor (created on first sight)."""

    processor: int
    delay: int
    task: str
    state: ArrayRef
    images: dict[str, ArrayRef]
    prefix_model: ArrayRef | None
    prefix_robot: ArrayRef | None


class Infer(msgspec.Struct, tag=True, frozen=True):
    """Serve ``requests`` in one batch, after the episode bookkeeping the server did since the last."""

    requests: list[Request]
    #: Processors to reset before serving, and processors whose sessions are gone.
    resets: list[int] = []
    dropped: list[int] = []
    reset_policy: bool = False


class Loaded(msgspec.Struct, tag=True, frozen=True):
    """The policy is loaded: what it is, and whether it predicts batches."""

    spec: PolicySpec
    batching: bool


class Durations(msgspec.Struct, tag=True, frozen=True):
    """Seconds per forward (warm-up, timed forwards)."""

    seconds: list[float]


class Chunk(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A served request: model-space and robot-space chunks."""

    model: ArrayRef
    robot: ArrayRef


class Failure(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """What made a request (or a load, warm-up) fail: exception type name and message."""

    kind: str
    message: str
    #: The module a ``ModuleNotFoundError`` names (servo-serve says which extra installs it).
    missing: str | None = None


class Outcomes(msgspec.Struct, tag=True, frozen=True):
    """One outcome per request of an `Infer`, in its order."""

    outcomes: list[Chunk | Failure]


class Failed(msgspec.Struct, tag=True, frozen=True):
    """A `Load`, `Warmup` or `Timed` failed."""

    failure: Failure


Message = Load | Warmup | Timed | Infer | Loaded | Durations | Outcomes | Failed

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


class Body:
    """The arrays of a message being built: each is referenced in the header, sent as is."""

    def __init__(self) -> None:
        self.buffers: list[memoryview] = []

    def add(self, array: npt.NDArray[Any]) -> ArrayRef:
        """Send ``array`` (from its own buffer when it is contiguous) and say where it is."""
        array = np.ascontiguousarray(array)
        if array.dtype.name not in _DTYPES:
            raise TypeError(f"cannot send a {array.dtype} array to the policy process")
        self.buffers.append(array.reshape(-1).view(np.uint8).data)
        return ArrayRef(array.dtype.name, tuple(array.shape))

    def observation(self, processor: int, obs: DecodedObservation, delay: int) -> Request:
        """A request for ``obs`` (its ``extras`` stay behind: the server's decoder sets none)."""
        return Request(
            processor,
            delay,
            obs.task,
            self.add(obs.state),
            {name: self.add(np.asarray(frame)) for name, frame in obs.images.items()},
            None if obs.prefix_model is None else self.add(obs.prefix_model),
            None if obs.prefix_robot is None else self.add(obs.prefix_robot),
        )


class Arrays:
    """The arrays of a received message, taken in header order (views on one buffer)."""

    def __init__(self, body: memoryview) -> None:
        self._body = body
        self._offset = 0

    def take(self, ref: ArrayRef) -> npt.NDArray[Any]:
        """The next array: a view on the message's buffer."""
        if ref.dtype not in _DTYPES:
            raise ChannelClosed(f"policy process sent an array of dtype {ref.dtype!r}")
        end = self._offset + ref.nbytes
        if end > len(self._body):
            raise ChannelClosed("policy process sent an array past the end of its message")
        array = np.frombuffer(self._body[self._offset : end], dtype=ref.dtype).reshape(ref.shape)
        self._offset = end
        return array

    def observation(self, request: Request) -> DecodedObservation:
        """The observation of ``request``, its arrays taken in the order `Body.observation` added them."""
        return DecodedObservation(
            state=self.take(request.state),
            images={name: self.take(ref) for name, ref in request.images.items()},
            task=request.task,
            prefix_model=None if request.prefix_model is None else self.take(request.prefix_model),
            prefix_robot=None if request.prefix_robot is None else self.take(request.prefix_robot),
        )


class Channel:
    """One end of the link. Owned by one thread at a time (sends and receives alternate).

    ``arena`` says which way shared memory goes: the server's end ``"writes"`` its large bodies
    (frames) into an arena of its own and takes no descriptor from the policy process, which runs
    the user's model code and must not be able to hand the server memory that faults under it; the
    policy process's end ``"reads"`` the server's arena and sends its own bodies (chunks) on the
    stream.
    """

    def __init__(self, sock: socket.socket, *, arena: Literal["writes", "reads"]) -> None:
        self._sock = sock
        self._writes = arena == "writes"
        self._outgoing = _arena.Outgoing()
        self._incoming = _arena.Incoming()
        # Frames cross in a few large writes rather than many wake-ups of the other side (the
        # kernel caps the size at its net.core limits): a 1.8 MB round trip took half the time.
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)

    def send(self, message: Message, body: Body | None = None) -> None:
        """Send ``message`` with ``body``'s arrays (the GIL is released while the kernel copies).

        Raises:
            ChannelClosed: the other end is gone.
        """
        header = _encoder.encode(message)
        buffers: Sequence[memoryview] = body.buffers if body is not None else ()
        length = sum(b.nbytes for b in buffers)
        in_arena = self._writes and _arena.AVAILABLE and length >= _arena.ARENA_MIN_BYTES
        new_arena = None
        if in_arena:
            try:
                new_arena = self._outgoing.place(buffers, length)
            except OSError as exc:  # no memfd now (descriptors exhausted): this body takes the stream
                log.warning("policy link: frames on the socket", reason=str(exc))
                in_arena = False
        prefix = _PREFIX.pack(len(header), length, _IN_ARENA if in_arena else _ON_STREAM)
        try:
            if new_arena is None:
                self._sock.sendall(prefix + header)
            else:  # the descriptor rides with the prefix's bytes
                sent = socket.send_fds(self._sock, [prefix + header], [new_arena])
                self._sock.sendall(memoryview(prefix + header)[sent:])
            if not in_arena:
                for buffer in buffers:
                    self._sock.sendall(buffer)
        except OSError as exc:
            raise ChannelClosed(f"policy link closed: {exc}") from None
        finally:
            if new_arena is not None:
                os.close(new_arena)  # sent (or not): the mapping stays

    def receive(self) -> tuple[Message, Arrays]:
        """The next message and its arrays.

        Raises:
            ChannelClosed: the other end is gone, or sent something that is not a message.
        """
        prefix, fds = self._read_prefix()
        header_len, body_len, where = _PREFIX.unpack(prefix)
        try:
            if header_len > MAX_HEADER_BYTES or body_len > MAX_BODY_BYTES:
                raise ChannelClosed(f"policy link sent a {header_len} B header / {body_len} B body: too large")
            if self._writes and (fds or where != _ON_STREAM):
                raise ChannelClosed(f"policy link sent {len(fds)} descriptors, body at {where}, to an end taking none")
            if len(fds) > 1:
                raise ChannelClosed(f"policy link sent {len(fds)} descriptors with one message")
            if where not in (_ON_STREAM, _IN_ARENA) or (fds and where != _IN_ARENA):
                raise ChannelClosed(f"policy link sent a body at {where} with {len(fds)} descriptors")
            if fds:
                # The body bound, in whole pages: the most of an arena a body can use.
                self._incoming.adopt(fds.pop(), MAX_BODY_BYTES + mmap.PAGESIZE)
        except (_arena.ArenaError, OSError) as exc:  # OSError: the kernel would not map it
            raise ChannelClosed(f"policy link sent an unusable arena: {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)
        try:
            message = _decoder.decode(self._read(header_len))
        except msgspec.DecodeError as exc:
            raise ChannelClosed(f"policy link sent a malformed message: {exc}") from None
        if where == _ON_STREAM:
            return message, Arrays(self._read(body_len))
        try:
            return message, Arrays(self._incoming.copy_out(body_len))
        except _arena.ArenaError as exc:
            raise ChannelClosed(str(exc)) from None

    def close(self) -> None:
        """Close this end: the other end's next receive raises `ChannelClosed`."""
        self._sock.close()
        self._outgoing.close()
        self._incoming.close()

    def finish(self, timeout: float) -> bool:
        """Tell the other end nothing more comes, and wait until it has closed its end.

        Never reads: a reply still on its way stays for whoever waits on it. False when the other
        end has not closed within ``timeout`` s.
        """
        with contextlib.suppress(OSError):  # already gone
            self._sock.shutdown(socket.SHUT_WR)
        poller = select.poll()
        poller.register(self._sock, 0)  # hang-up and errors are reported whatever the mask
        return bool(poller.poll(timeout * 1000))

    def _read_prefix(self) -> tuple[bytes, list[int]]:
        """A message's prefix, and the descriptors that came with it (at most one: more is refused)."""
        prefix = bytearray(_PREFIX.size)
        view, fds = memoryview(prefix), array.array("i")
        while view.nbytes:
            try:
                got, ancillary, flags, _ = self._sock.recvmsg_into(
                    [view], socket.CMSG_SPACE(fds.itemsize), socket.MSG_CMSG_CLOEXEC
                )
            except OSError as exc:
                for fd in fds:  # came with the prefix's first bytes
                    os.close(fd)
                raise ChannelClosed(f"policy link closed: {exc}") from None
            for level, kind, data in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            if flags & socket.MSG_CTRUNC or got == 0:
                for fd in fds:
                    os.close(fd)
                raise ChannelClosed("policy link sent too many descriptors" if got else "policy link closed")
            view = view[got:]
        return bytes(prefix), list(fds)

    def _read(self, size: int) -> memoryview:
        # Not a bytearray: that zero-fills every byte before the kernel overwrites it.
        view = buffer = np.empty(size, np.uint8).data
        while view.nbytes:
            try:
                got = self._sock.recv_into(view)
            except OSError as exc:
                raise ChannelClosed(f"policy link closed: {exc}") from None
            if got == 0:
                raise ChannelClosed("policy link closed by the other end")
            view = view[got:]
        return buffer
