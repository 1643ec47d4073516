"""The uplink and its camera encoders: every observation handed over is settled, and none keeps a process alive.

A put that never returns stands for a stalled link (the publisher is a fake injected in its
place); closing the uplink must then settle what waits behind it and let the process exit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from servo._core import MSG_OBS, SCHEMA_VERSION, Header, SessionKey
from servo.client.codec import CodecChooser
from servo.client.encoder import FrameEncoder
from servo.client.results import SessionStats
from servo.client.uplink import Outgoing, Uplink
from servo.stages import NotRun
from servo.wire import encode_tensor

#: A wait that only ends early when the code under test is right.
LONG_S = 30.0
FRAMES = {"front": np.zeros((48, 64, 3), np.uint8), "wrist": np.ones((48, 64, 3), np.uint8)}


class StalledPublisher:
    """A Zenoh publisher whose first put never returns (a link that stopped taking bytes)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.puts = 0

    def put(self, body: bytes, *, attachment: bytes) -> None:
        self.puts += 1
        self.entered.set()
        threading.Event().wait()  # never set

    def undeclare(self) -> None:
        pass


def outgoing(seq: int, quality: int = 90) -> Outgoing:
    header = Header(SCHEMA_VERSION, MSG_OBS, 0, seq, 0, 1, time.monotonic_ns(), bytes(16))
    return Outgoing(
        header=header,
        key=SessionKey(bytes(32), role="client"),
        frames=FRAMES,
        quality=quality,
        state=encode_tensor(np.zeros(6, np.float32)),
        task="",
        inference_delay_steps=0,
        prefix_model=None,
        prefix_robot=None,
        started_ns=time.monotonic_ns(),
        sizes={},
    )


def test_closing_the_uplink_settles_the_observation_behind_a_stalled_put() -> None:
    publisher = StalledPublisher()
    uplink = Uplink(publisher, SessionStats(), CodecChooser(90))  # type: ignore[arg-type]
    stuck = uplink.submit(outgoing(1))
    assert publisher.entered.wait(LONG_S)
    waiting = uplink.submit(outgoing(2))
    uplink.close()
    # Settled by the close itself, with the reason: never dropped without a word.
    with pytest.raises(NotRun):
        waiting.result(0)
    assert not stuck.done()  # the put still blocks; nobody waits for it
    assert publisher.puts == 1


EXIT_SCRIPT = """
import threading, time
from tests.client.test_uplink import StalledPublisher, outgoing
from servo.client.codec import CodecChooser
from servo.client.results import SessionStats
from servo.client.uplink import Uplink

publisher = StalledPublisher()
uplink = Uplink(publisher, SessionStats(), CodecChooser(90))
uplink.submit(outgoing(1))
publisher.entered.wait()
uplink.submit(outgoing(2))
uplink.close()
print(time.monotonic(), flush=True)
"""


def test_a_process_whose_uplink_put_stalled_exits_at_once_after_close() -> None:
    # Before servo.stages the sender was a non-daemon executor thread that the interpreter
    # joined at exit: a put stuck on a dead link kept the process alive for good.
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(EXIT_SCRIPT)], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=LONG_S)
    finally:
        proc.kill()
    ended = time.monotonic()
    assert proc.returncode == 0
    assert ended - float(out) < 1.0


def test_closing_the_encoder_while_cameras_have_work_settles_every_encode() -> None:
    # The close lands anywhere: before a camera thread took its job, during it, or after. Each
    # encode returns its frames or fails with NotRun; none waits for a job nobody will run.
    outcomes: list[str] = []
    for _ in range(50):
        encoder = FrameEncoder()
        done = threading.Event()

        def send(encoder: FrameEncoder = encoder, done: threading.Event = done) -> None:
            try:
                encoder.encode(FRAMES, 90)
                outcomes.append("encoded")
            except NotRun:
                outcomes.append("not run")
            done.set()

        sender = threading.Thread(target=send)
        sender.start()
        encoder.close()
        assert done.wait(LONG_S), "an encode waited for a camera job that was dropped"
        sender.join()
    assert len(outcomes) == 50
