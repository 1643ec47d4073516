"""The policy link's arena (`servo.policy.arena`): the server's large bodies cross in shared memory
the policy process can only read, each received into the receiver's own buffer; whatever else
comes with a message is refused and closed."""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import struct
import sys
import termios
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from servo.policy import arena
from servo.policy.channel import Body, Channel, ChannelClosed, Infer
from servo.policy.protocol import DecodedObservation

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="memfd and /proc are Linux's")

PREFIX = struct.Struct("<IQB")
ON_STREAM, IN_ARENA = 0, 1
ALL_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
Link = tuple[Channel, Channel, socket.socket, socket.socket]


@pytest.fixture
def link() -> Iterator[tuple[Channel, Channel, socket.socket, socket.socket]]:
    """The server's end, the policy process's end, and the sockets under them (policy's, server's)."""
    ours, theirs = socket.socketpair()
    server, policy = Channel(theirs, arena="writes"), Channel(ours, arena="reads")
    yield server, policy, ours, theirs
    server.close()
    policy.close()


def observation(seed: int, height: int = 480, width: int = 640) -> DecodedObservation:
    rng = np.random.default_rng(seed)
    frames = {name: rng.integers(0, 255, (height, width, 3), np.uint8) for name in ("front", "wrist")}
    return DecodedObservation(state=rng.random(6, np.float32), images=frames, task="")


def send(channel: Channel, obs: DecodedObservation) -> None:
    body = Body()
    channel.send(Infer([body.observation(1, obs, 0)]), body)


def receive(channel: Channel) -> DecodedObservation:
    message, arrays = channel.receive()
    assert isinstance(message, Infer)
    return arrays.observation(message.requests[0])


def assert_same(got: DecodedObservation, sent: DecodedObservation) -> None:
    np.testing.assert_array_equal(got.state, sent.state)
    for name, frame in sent.images.items():
        np.testing.assert_array_equal(got.images[name], frame)


def queued(sock: socket.socket) -> int:
    """Bytes waiting to be read on ``sock``."""
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4))[0])


def arena_mappings() -> list[tuple[int, str]]:
    """(size, permissions) of each arena mapped in this process."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "servo-policy-link" in line:
            span, perms, *_ = line.split()
            start, end = (int(x, 16) for x in span.split("-"))
            out.append((end - start, perms))
    return sorted(out)


def test_frames_cross_in_the_arena_and_only_the_header_on_the_socket(
    link: Link,
) -> None:
    server, policy, sock, _ = link
    sent = observation(1)
    send(server, sent)
    assert 0 < queued(sock) < 1024  # of 1.84 MB
    assert_same(receive(policy), sent)
    small = observation(2, 48, 64)
    assert sum(f.nbytes for f in small.images.values()) < arena.ARENA_MIN_BYTES  # 18 kB: on the stream
    send(server, small)
    assert queued(sock) > sum(frame.nbytes for frame in small.images.values())
    assert_same(receive(policy), small)


def test_the_policy_process_sends_its_bodies_on_the_stream(link: Link) -> None:
    server, policy, _, sock = link
    sent = observation(3, 120, 160)  # 115 kB: the arena's size, and a stock kernel's socket buffers take it
    assert sum(frame.nbytes for frame in sent.images.values()) >= arena.ARENA_MIN_BYTES
    send(policy, sent)
    assert queued(sock) > sum(frame.nbytes for frame in sent.images.values())  # all of it on the socket
    assert_same(receive(server), sent)


def test_a_received_body_is_the_receivers_own(link: Link) -> None:
    server, policy, *_ = link
    first, second = observation(1), observation(2)
    send(server, first)
    kept = receive(policy)  # a policy keeping past frames
    send(server, second)  # rewrites the arena
    assert_same(receive(policy), second)
    assert_same(kept, first)


def test_the_arena_grows_for_a_larger_body_and_the_old_one_is_unmapped(
    link: Link,
) -> None:
    server, policy, *_ = link
    before = arena_mappings()
    for obs in (observation(1), observation(2, 2160, 3840), observation(3)):  # 1.8, 50 and 1.8 MB
        send(server, obs)
        assert_same(receive(policy), obs)
    large = sum(frame.nbytes for frame in observation(2, 2160, 3840).images.values()) + 6 * 4
    size = -(-large // mmap.PAGESIZE) * mmap.PAGESIZE
    assert arena_mappings() == sorted([*before, (size, "r--s"), (size, "rw-s")])  # the grown one, by each end
    server.close()
    policy.close()
    assert arena_mappings() == before


def test_nobody_can_write_to_an_arena_but_its_writer(link: Link) -> None:
    server, policy, *_ = link
    send(server, observation(1))
    receive(policy)
    held = [fd for fd in os.listdir("/proc/self/fd") if "servo-policy-link" in _target(fd)]
    assert held, "the arena's descriptors"
    for fd in held:  # the writer's and the reader's, each opened again for writing
        again = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                mmap.mmap(again, mmap.PAGESIZE)
            with pytest.raises(PermissionError):
                os.write(again, b"x")
        finally:
            os.close(again)


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the listing's own descriptor, closed by now
        return ""


def forged(sock: socket.socket, fds: list[int], *, body: int = 1 << 20, where: int = IN_ARENA) -> None:
    """A message whose body the header says is ``body`` bytes at ``where``, with ``fds`` attached."""
    header = msgspec.msgpack.encode(Infer([]))
    socket.send_fds(sock, [PREFIX.pack(len(header), body, where) + header], fds)


def memfd(size: int, seals: int, *, mode: int = os.O_RDONLY) -> int:
    fd = os.memfd_create("forged", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    reopened = os.open(f"/proc/self/fd/{fd}", mode | os.O_CLOEXEC)
    os.close(fd)
    return reopened


#: What the pipes a test forged point to (``pipe:[inode]``).
PIPES: set[str] = set()


def pipe_end() -> int:
    read, write = os.pipe()
    os.close(write)
    PIPES.add(os.readlink(f"/proc/self/fd/{read}"))
    return read


def forged_left_open() -> list[str]:
    """Descriptors of this process still pointing at what a test forged."""
    return [t for fd in os.listdir("/proc/self/fd") if (t := _target(fd)).startswith("/memfd:forged") or t in PIPES]


@pytest.mark.parametrize(
    ("make", "body", "where", "refusal"),
    [
        (lambda: [memfd(2 << 20, 0)], 1 << 20, IN_ARENA, "not sealed"),
        (lambda: [memfd(2 << 20, fcntl.F_SEAL_GROW)], 1 << 20, IN_ARENA, "not sealed"),
        (lambda: [pipe_end()], 1 << 20, IN_ARENA, "not a memfd"),
        (lambda: [memfd(2 << 20, ALL_SEALS, mode=os.O_WRONLY)], 1 << 20, IN_ARENA, "unusable arena"),
        (lambda: [memfd(16 << 30, ALL_SEALS)], 1 << 20, IN_ARENA, "too large"),
        (lambda: [memfd(1 << 20, ALL_SEALS)], 2 << 20, IN_ARENA, "in its 1048576 B arena"),
        (lambda: [], 1 << 20, IN_ARENA, "in its 0 B arena"),
        (lambda: [memfd(2 << 20, ALL_SEALS)], 1 << 20, ON_STREAM, "with 1 descriptors"),
        (lambda: [memfd(2 << 20, ALL_SEALS)], 1 << 20, 7, "at 7"),
        (lambda: [memfd(2 << 20, ALL_SEALS), memfd(2 << 20, ALL_SEALS)], 1 << 20, IN_ARENA, "2 descriptors"),
    ],
    ids=[
        "unsealed",
        "shrinkable",
        "a-pipe",
        "write-only",
        "huge",
        "body-past-the-arena",
        "no-arena",
        "stream-body",
        "nowhere",
        "two",
    ],
)
def test_the_policy_process_refuses_a_forged_arena_and_keeps_no_descriptor(
    make: Callable[[], list[int]], body: int, where: int, refusal: str
) -> None:
    ours, theirs = socket.socketpair()
    policy = Channel(ours, arena="reads")
    with theirs:
        fds = make()
        forged(theirs, fds, body=body, where=where)
        for fd in fds:
            os.close(fd)
        with pytest.raises(ChannelClosed, match=refusal):
            policy.receive()
        policy.close()  # and with it an arena adopted before the refusal
    assert forged_left_open() == []


@pytest.mark.parametrize(
    ("with_fd", "where"),
    [(True, ON_STREAM), (True, IN_ARENA), (False, IN_ARENA)],
    ids=["a-descriptor", "an-arena", "an-arena-body"],
)
def test_the_server_takes_no_descriptor_and_no_arena_from_the_policy_process(with_fd: bool, where: int) -> None:
    ours, theirs = socket.socketpair()
    server = Channel(ours, arena="writes")
    with theirs:
        fds = [memfd(2 << 20, ALL_SEALS)] if with_fd else []
        forged(theirs, fds, where=where)
        for fd in fds:
            os.close(fd)
        with pytest.raises(ChannelClosed, match="descriptors"):
            server.receive()
    server.close()
    assert forged_left_open() == []
    assert "/memfd:forged" not in Path("/proc/self/maps").read_text()  # nothing of theirs was mapped


def test_a_descriptor_that_came_with_half_a_prefix_is_closed_when_the_link_breaks() -> None:
    ours, theirs = socket.socketpair()
    policy = Channel(ours, arena="reads")
    fd = memfd(2 << 20, ALL_SEALS)
    socket.send_fds(theirs, [b"\x01"], [fd])
    os.close(fd)
    theirs.close()
    with pytest.raises(ChannelClosed, match="closed"):
        policy.receive()
    policy.close()
    assert forged_left_open() == []
