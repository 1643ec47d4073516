"""The policy link's arena (`servo.policy.arena`): large bodies cross in shared memory, each
received into the receiver's own buffer, and whatever else comes with a message is refused."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from servo.policy import arena
from servo.policy.channel import Body, Channel, ChannelClosed, Infer
from servo.policy.protocol import DecodedObservation

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="memfd and /proc are Linux's")

PREFIX = struct.Struct("<IQB")
IN_ARENA = 1


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield ours, theirs


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
    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4))[0]


def open_files() -> list[str]:
    """What this process's descriptors point to (the listing's own directory left out)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's descriptor, closed by now
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return sorted(targets)


def test_frames_cross_in_the_arena_and_only_the_header_on_the_socket(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    sender, receiver = Channel(theirs), Channel(ours)
    sent = observation(1)
    send(sender, sent)
    assert 0 < queued(ours) < 1024  # of 1.84 MB
    assert_same(receive(receiver), sent)
    small = observation(2, 48, 64)
    assert sum(f.nbytes for f in small.images.values()) < arena.ARENA_MIN_BYTES  # 18 kB: on the stream
    send(sender, small)
    assert queued(ours) > sum(frame.nbytes for frame in small.images.values())
    assert_same(receive(receiver), small)


def test_a_received_body_is_the_receivers_own(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    sender, receiver = Channel(theirs), Channel(ours)
    first, second = observation(1), observation(2)
    send(sender, first)
    kept = receive(receiver)  # a policy keeping past frames
    send(sender, second)  # rewrites the arena
    assert_same(receive(receiver), second)
    assert_same(kept, first)


def test_the_arena_grows_for_a_larger_body_and_the_old_one_is_unmapped(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    sender, receiver = Channel(theirs), Channel(ours)
    for obs in (observation(1), observation(2, 2160, 3840), observation(3)):  # 1.8, 50 and 1.8 MB
        send(sender, obs)
        assert_same(receive(receiver), obs)
    large = sum(frame.nbytes for frame in observation(2, 2160, 3840).images.values()) + 6 * 4
    size = -(-large // os.sysconf("SC_PAGESIZE")) * os.sysconf("SC_PAGESIZE")
    assert sorted(arena_mappings()) == [(size, "r--s"), (size, "rw-s")]  # the grown one, by each end
    sender.close()
    receiver.close()
    assert arena_mappings() == []


def arena_mappings() -> list[tuple[int, str]]:
    """(size, permissions) of each arena mapped in this process."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "servo-policy-link" in line:
            span, perms, *_ = line.split()
            start, end = (int(x, 16) for x in span.split("-"))
            out.append((end - start, perms))
    return out


def forged(theirs: socket.socket, fds: list[int], *, body: int = 1 << 20, where: int = IN_ARENA) -> None:
    """A message whose body the header says is ``body`` bytes at ``where``, with ``fds`` attached."""
    header = msgspec.msgpack.encode(Infer([]))
    socket.send_fds(theirs, [PREFIX.pack(len(header), body, where) + header], fds)


def memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("forged", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def pipe_end() -> int:
    read, write = os.pipe()
    os.close(write)
    return read


ALL_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


@pytest.mark.parametrize(
    ("make", "body", "where", "refusal"),
    [
        (lambda: [memfd(2 << 20, 0)], 1 << 20, IN_ARENA, "not sealed"),
        (lambda: [memfd(2 << 20, fcntl.F_SEAL_GROW)], 1 << 20, IN_ARENA, "not sealed"),
        (lambda: [pipe_end()], 1 << 20, IN_ARENA, "not a memfd"),
        (lambda: [memfd(1 << 20, ALL_SEALS)], 2 << 20, IN_ARENA, "in its 1048576 B arena"),
        (lambda: [], 1 << 20, IN_ARENA, "in its 0 B arena"),
        (lambda: [memfd(2 << 20, ALL_SEALS)], 1 << 20, 0, "with 1 descriptors"),
        (lambda: [memfd(2 << 20, ALL_SEALS)], 1 << 20, 7, "at 7"),
        (lambda: [memfd(2 << 20, ALL_SEALS), memfd(2 << 20, ALL_SEALS)], 1 << 20, IN_ARENA, "2 descriptors"),
    ],
    ids=["unsealed", "shrinkable", "a-pipe", "body-past-the-arena", "no-arena", "stream-body", "nowhere", "two"],
)
def test_the_link_refuses_a_forged_arena_and_keeps_no_descriptor(
    pair: tuple[socket.socket, socket.socket], make: object, body: int, where: int, refusal: str
) -> None:
    ours, theirs = pair
    receiver = Channel(ours)
    before = open_files()
    fds = make()  # type: ignore[operator]
    forged(theirs, fds, body=body, where=where)
    for fd in fds:
        os.close(fd)
    with pytest.raises(ChannelClosed, match=refusal):
        receiver.receive()
    before.remove(os.readlink(f"/proc/self/fd/{ours.fileno()}"))
    receiver.close()  # and with it an arena adopted before the refusal
    assert open_files() == before  # nothing that came with the message is left open
