"""Where the policy link's large bodies cross: an anonymous memfd each end writes its arrays into.

Over the socketpair alone, a 1.8 MB observation costs the kernel a copy on each side and, with
a stock kernel's socket buffers (about 208 kB), nine wake-ups of the reader per message. Through
an arena the sender copies its arrays into shared memory of its own, only the message's header
crosses the socket, and the receiver copies the body out into a buffer of its own. Beside the
stream, a 1.8 MB round trip took half the CPU or less, and a shorter tail
(``benches/bench_policy_link.py``).

* **The receiver copies.** A policy may keep an observation's arrays after its forward (a queue
  of past frames); reading them in place would let the sender's next message rewrite them.
* **Reuse is safe because the link alternates.** Each end sends only after it has received the
  other's answer to its last message, and a receiver copies a body out before it answers, so an
  arena is never rewritten while the other end reads it.
* **No door.** A memfd has no name in any file system (only a label in ``/proc/<pid>/maps``). A
  read-only descriptor of it crosses the socketpair, which only the server and its child hold.
  Once the writer has mapped it, it is sealed against resizing and against any later write but
  the writer's own mapping (``F_SEAL_FUTURE_WRITE``): the reader cannot map it writable, not even
  by opening ``/proc/self/fd/N`` again, nor make itself fault (``SIGBUS``) by truncating it.
* **One way only.** The server writes, the policy process reads (`servo.policy.channel.Channel`'s
  ``arena``): the policy process runs the user's model code, and the server maps nothing it
  sends (a hugetlbfs memfd, say, can lose its pages under a reader even when sealed).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Sequence

import numpy as np

from servo.errors import PolicyError

#: Bodies from this size on cross through the arena; smaller ones (chunks, errors) on the stream.
ARENA_MIN_BYTES = 64 << 10
#: An arena's first size: two 1080p cameras' frames fit.
FIRST_ARENA_BYTES = 16 << 20
#: Seals every arena carries: its size can no longer change, nor its seals.
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
#: No write but through the mappings made before it (Linux 5.1; Python's fcntl does not name it).
_SEAL_FUTURE_WRITE = 0x0010
#: Whether this system has memfds (Linux); elsewhere every body crosses on the stream.
AVAILABLE = hasattr(os, "memfd_create")


class ArenaError(PolicyError, ConnectionError):
    """The other end's arena is missing, unsealed or too small for what it says it holds."""


class _Mapped:
    """An arena mapped in this process (none before the first)."""

    def __init__(self) -> None:
        self._memory: mmap.mmap | None = None
        self._view: np.ndarray | None = None

    def close(self) -> None:
        """Unmap the arena."""
        self._view = None
        if self._memory is not None:
            with contextlib.suppress(BufferError):  # a view still held: the collector unmaps it
                self._memory.close()
            self._memory = None

    def _hold(self, memory: mmap.mmap | None) -> None:
        self.close()
        if memory is not None:
            self._memory, self._view = memory, np.frombuffer(memory, np.uint8)


class Outgoing(_Mapped):
    """This end's arena: it writes message bodies here. Owned by the thread that sends."""

    def place(self, buffers: Sequence[memoryview], length: int) -> int | None:
        """Copy ``buffers`` (``length`` bytes) to the arena's start.

        Returns a read-only descriptor of a new arena when the body did not fit the last one (or
        there was none): send it with this message, then close it (the mapping stays).
        """
        fd = None
        if self._view is None or self._view.nbytes < length:
            fd = self._grow(length)
        view = self._view
        assert view is not None
        at = 0
        for buffer in buffers:
            # numpy copies with the GIL released.
            view[at : at + buffer.nbytes] = np.frombuffer(buffer, np.uint8)
            at += buffer.nbytes
        return fd

    def _grow(self, length: int) -> int:
        size = max(length, FIRST_ARENA_BYTES, 2 * (0 if self._view is None else self._view.nbytes))
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("servo-policy-link", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            memory = mmap.mmap(fd, size)  # it keeps a descriptor of its own
            try:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | _SEAL_FUTURE_WRITE)
                readonly = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
            except BaseException:
                memory.close()
                raise
        finally:
            os.close(fd)
        self._hold(memory)
        return readonly


class Incoming(_Mapped):
    """The other end's arena, mapped read-only. Owned by the thread that receives."""

    def adopt(self, fd: int, max_bytes: int) -> None:
        """Map the arena the other end sent (replacing the last), read-only, and close ``fd``.

        Raises:
            ArenaError: ``fd`` is not a sealed memfd, or it is larger than ``max_bytes``.
        """
        try:
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError as exc:
                raise ArenaError(f"the policy link sent a descriptor that is not a memfd: {exc}") from None
            if seals & _SEALS != _SEALS:
                raise ArenaError("the policy link sent an arena that is not sealed against resizing")
            size = os.fstat(fd).st_size
            if size > max_bytes:
                raise ArenaError(f"the policy link sent a {size} B arena: too large")
            memory = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        finally:
            os.close(fd)
        self._hold(memory)

    def copy_out(self, length: int) -> memoryview:
        """The arena's first ``length`` bytes, copied into a buffer of the caller's own.

        Raises:
            ArenaError: no arena came, or it is shorter than ``length``.
        """
        view = self._view  # read once: `close` may run on another thread (a forward abandoned at stop)
        if view is None or view.nbytes < length:
            have = 0 if view is None else view.nbytes
            raise ArenaError(f"the policy link said a {length} B body is in its {have} B arena")
        body = np.empty(length, np.uint8)  # not zero-filled: every byte is written below
        body[:] = view[:length]
        return body.data
