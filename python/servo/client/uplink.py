"""A session's way out: encode, pack, encrypt and put each observation in one job off the event loop.

The event loop only decides (the seq_id, the codec, the header: `servo.client.protocol`) and
hands the job over; the uplink's one stage thread ("servo-send") encodes the frames (JPEG on the
per-camera stages of `servo.client.encoder`), packs the `Observation` into one buffer it reuses,
encrypts it there with the session key (one pass, the header under the tag: no second buffer)
and puts it (Zenoh copies it). A put lasts as long as the transfer: ~1 ms on loopback, ~150 ms
for a raw observation on 100 Mbit/s, so it must not run on the loop either. The stage is
newest-wins: an observation still waiting behind a slow put when a newer one (or its own copy)
comes never leaves; its future fails with `Superseded`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass

import zenoh

from servo._core import Header, SessionKey
from servo.client.codec import CodecChooser
from servo.client.encoder import Frame, FrameEncoder
from servo.client.results import SessionStats
from servo.stages import StageThread
from servo.wire import Observation, Tensor, encode_into


@dataclass(frozen=True)
class Outgoing:
    """One observation to send, as decided on the event loop (frozen; handed to the uplink thread).

    The small tensors are already packed (copied) on the loop; the frames are read on the uplink
    thread, so the caller must not write to them after `RemoteSession.send` returned.
    """

    header: Header
    key: SessionKey
    frames: Mapping[str, Frame]
    quality: int
    state: Tensor
    task: str
    inference_delay_steps: int
    prefix_model: Tensor | None
    prefix_robot: Tensor | None
    started_ns: int
    #: The (height, width) the server takes each camera at, when smaller (its ack's ``input_sizes``).
    sizes: Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class Sent:
    """What one observation cost on the way out, for the codec chooser (`time.monotonic_ns` stamps)."""

    seq_id: int
    quality: int
    started_ns: int
    encode_ms: float
    nbytes: int


class Uplink:
    """The session's sender stage and encoder. Created, fed and closed by the event loop.

    Its thread owns the message buffer and writes ``stats.encode`` (a thread-safe tracker),
    ``stats.last_encode_ms`` and the newest `Sent` record (under a lock, taken back on the loop
    by `record_cost`, which tells ``codec`` what the request cost). Every job's `Future` settles:
    done once put, failed with what the put raised, or with `servo.stages.NotRun` when it never
    left (superseded, closed).

    ::

        open ──submit──► waiting ──servo-send──► encode, pack, encrypt, put ──► done / failed
                            │ a newer submit: Superseded
        open ──close()──► closed: waiting and later jobs fail with StageClosed; a put under
                          way runs on (a stalled link ends it; nobody waits for it)
    """

    def __init__(self, publisher: zenoh.Publisher, stats: SessionStats, codec: CodecChooser) -> None:
        self._publisher = publisher
        self._stats = stats
        self._codec = codec
        self.encoder = FrameEncoder()
        self._stage = StageThread("servo-send", newest_wins=True)
        self._lock = threading.Lock()
        self._sent: Sent | None = None
        #: The observation being sent, encoded then encrypted in place (uplink thread only).
        self._buffer = bytearray()

    def submit(self, job: Outgoing) -> Future[None]:
        """Send ``job`` once the one being sent (if any) left; it replaces one still waiting."""
        return self._stage.submit(self._send, job)

    def record_cost(self, seq_id: int, now_ns: int, *, server_ms: float) -> None:
        """Event loop: tell the codec chooser what request ``seq_id`` cost, server compute excluded.

        Once per request; nothing when a newer one was sent meanwhile.
        """
        with self._lock:
            sent = self._sent
            if sent is None or sent.seq_id != seq_id:
                return
            self._sent = None
        net_ms = (now_ns - sent.started_ns) / 1e6 - sent.encode_ms - server_ms
        self._codec.record(sent.quality, encode_ms=sent.encode_ms, net_ms=max(0.0, net_ms), nbytes=sent.nbytes)

    def _send(self, job: Outgoing) -> None:
        """Uplink thread: the whole way out of one observation."""
        images = self.encoder.encode(job.frames, job.quality, job.sizes)
        encode_into(
            Observation(
                state=job.state,
                images=images,
                task=job.task,
                inference_delay_steps=job.inference_delay_steps,
                prefix_model=job.prefix_model,
                prefix_robot=job.prefix_robot,
            ),
            self._buffer,
        )
        encode_ns = time.monotonic_ns() - job.started_ns
        self._stats.encode.add(encode_ns)
        self._stats.last_encode_ms = encode_ns / 1e6
        attachment = job.key.encrypt_in_place(job.header, self._buffer)
        nbytes = sum(len(image.data) for image in images.values())
        # Recorded before the put: the chunk may come back before the put returns.
        with self._lock:
            self._sent = Sent(job.header.seq_id, job.quality, job.started_ns, encode_ns / 1e6, nbytes)
        self._publisher.put(self._buffer, attachment=attachment)

    def close(self) -> None:
        """Settle what waits, stop taking jobs and undeclare the publisher (idempotent).

        A put blocked on a stalled link ends when Zenoh closes the link; nobody waits for it.
        """
        self._stage.close()
        self.encoder.close()
        # A put still running on the uplink thread makes the publisher refuse ("Already borrowed").
        with contextlib.suppress(zenoh.ZError, RuntimeError):
            self._publisher.undeclare()
