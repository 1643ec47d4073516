"""A session bound to one server replica: observations up, chunks down, one request in flight.

Three parts, each with one job:

* `servo.client.protocol.SessionProtocol` decides: seq_ids, what is encrypted, which server message
  may touch the request in flight (bytes in, verdicts out; no I/O);
* `servo.client.uplink.Uplink` sends: encode, pack, encrypt and put, in one job off the event loop;
* `RemoteSession` (here) is the Zenoh shell around them: it declares the session's entities, moves bytes
  from Zenoh callbacks to the protocol, and turns verdicts into what `send` / `receive` / `infer` return.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TypedDict, Unpack

import anyio
import numpy as np
import numpy.typing as npt
import zenoh
from zenoh.handlers import Callback

from servo._core import FLAG_EPISODE_START, SessionKey
from servo.client.codec import CodecChooser, CodecStatus
from servo.client.discovery import ServerInfo
from servo.client.errors import RequestTimeout, SendFailed, ServerError, SessionLost
from servo.client.protocol import Answered, Lost, SessionProtocol
from servo.client.replies import sealed_request
from servo.client.resend import ResendRule
from servo.client.results import ChunkResult
from servo.client.uplink import Outgoing, Uplink
from servo.logs import LogThrottle, get_logger
from servo.stages import LoopBridge, NotRun
from servo.transport import Declared, declare_obs_publisher, direct
from servo.wire import ClientKeys, CloseRequest, ResetRequest, SessionAck, encode_tensor

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]


class ObservationOptions(TypedDict, total=False):
    """`RemoteSession.send`'s keyword arguments, as `RemoteSession.infer` passes them on."""

    mono_ns: int | None
    task: str
    inference_delay_steps: int
    prefix_model: FloatArray | None
    prefix_robot: FloatArray | None
    episode_start: bool


class RemoteSession:
    """One robot's session on one replica.

    Owned by the event loop task that drives it; Zenoh callbacks only hand bytes to the loop,
    where the `SessionProtocol` judges them (one request in flight; what it refuses is counted in
    its ``counters``, shared with the `PolicyClient`), and the `Uplink` thread sends observations.

    ::

        created ──declare()──► declared ──established(ack, key)──► open ──close() / lost──► lost
    """

    def __init__(
        self,
        zsession: zenoh.Session,
        server: ServerInfo,
        keys: ClientKeys,
        protocol: SessionProtocol,
        *,
        codec: CodecChooser,
    ) -> None:
        self.server = server
        self.keys = keys
        self.protocol = protocol
        protocol.resend = ResendRule(forward_ms=server.status.inference_ms, sessions=server.status.active_sessions)
        #: The session epoch chosen at open, and this session's counters.
        self.epoch, self.stats = protocol.epoch, protocol.stats
        #: Raw or JPEG per request, fixed or from measured costs (the client's; the link is now this replica's).
        self.codec = codec
        codec.local = server.local
        self.lost = anyio.Event()
        self.lost_reason = ""
        self._z = zsession
        self._bridge = LoopBridge()
        self._result_ready = anyio.Event()
        self._matching = anyio.Event()
        self._matched = False
        self._uplink: Uplink | None = None
        #: The latest observation handed to the uplink (what `resend` sends again).
        self._last_job: Outgoing | None = None
        self._server_seen = False
        self._send_throttle = LogThrottle(1.0)
        self._entities: list[Declared] = []

    # ------------------------------------------------------------------ the protocol's state
    @property
    def ack(self) -> SessionAck | None:
        """The server's ack, once the handshake is done."""
        return self.protocol.ack

    @property
    def episode_id(self) -> int:
        """The episode later requests carry."""
        return self.protocol.episode_id

    @episode_id.setter
    def episode_id(self, value: int) -> None:
        self.protocol.episode_id = value

    @property
    def key(self) -> SessionKey:
        """The session key (`SessionProtocol.key`; raises `SessionLost` before the handshake)."""
        return self.protocol.key

    @property
    def wire_id(self) -> bytes:
        """Server-assigned id as it travels in headers: 16 bytes (zero before the ack)."""
        return self.protocol.wire_id

    @property
    def session_id(self) -> str:
        """Server-assigned id: 32 lowercase hex characters ("" before the ack)."""
        return self.protocol.session_id

    def codec_status(self) -> CodecStatus:
        """The codec chooser's snapshot, with each camera's latest encode time per quality."""
        status = self.codec.status()
        return status if self._uplink is None else self._uplink.encoder.with_camera_times(status)

    # ------------------------------------------------------------------ set-up / tear-down
    def declare(self) -> None:
        """Declare the action subscriber, observation publisher and liveliness entities.

        Done before the session-open query, so the server's first chunk cannot be lost to a
        subscription that has not propagated yet.
        """
        bridge = self._bridge
        on_matching: Callback[zenoh.MatchingStatus] = direct(lambda m: bridge.call(self._on_matching, m.matching))
        # Chunks and the server's token get a callback thread each, not Zenoh's receive task (`direct`):
        # waiting there for a starved GIL outlasted the lease and closed live links (test_busy_client.py).
        self._entities.append(self._z.declare_subscriber(self.keys.action, self._on_action))
        publisher = declare_obs_publisher(self._z, self.keys.obs)
        self._uplink = Uplink(publisher, self.stats, self.codec)
        self._entities.append(publisher.declare_matching_listener(on_matching))
        self._entities.append(self._z.liveliness().declare_token(self.keys.alive))
        server_alive = self._z.liveliness().declare_subscriber(
            self.server.keys.alive, lambda s: bridge.call(self._on_server_liveliness, s), history=True
        )
        self._entities.append(server_alive)

    async def wait_matched(self, timeout: float) -> bool:
        """Wait until the server's observation subscriber is known here (a put before that is lost)."""
        with anyio.move_on_after(timeout):
            await self._matching.wait()
        return self._matching.is_set()

    async def close(self, *, timeout: float = 0.5) -> None:
        """Tell the server (best effort, encrypted) and undeclare everything. Idempotent."""
        if self.ack is not None and not self.lost.is_set():
            with anyio.move_on_after(timeout):
                with contextlib.suppress(RequestTimeout, ServerError):
                    await sealed_request(self._z, self.keys.control, self.protocol, CloseRequest(self.wire_id), timeout)
        self._bridge.close()
        for entity in reversed(self._entities):
            with contextlib.suppress(zenoh.ZError):
                entity.undeclare()
        self._entities.clear()
        if self._uplink is not None:
            self._uplink.close()
            self._uplink = None
        self._mark_lost("closed")

    # ------------------------------------------------------------------ data plane
    async def send(
        self,
        state: npt.ArrayLike,
        images: Mapping[str, npt.NDArray[np.uint8]],
        *,
        mono_ns: int | None = None,
        task: str = "",
        inference_delay_steps: int = 0,
        prefix_model: FloatArray | None = None,
        prefix_robot: FloatArray | None = None,
        episode_start: bool = False,
    ) -> int:
        """Publish one observation (coded as ``codec`` picks); returns its seq_id at once.

        A newer request supersedes any request still in flight. The uplink thread encodes, packs,
        encrypts and puts it, reading ``images`` after this returned (and again for a `resend`): do
        not write to them. One that cannot leave (no server subscribes to it, the put fails)
        fails its `receive` at once with `SendFailed` (counted in ``stats.send_failed``).

        Args:
            state: Joint state (converted to float32).
            images: Camera frames by name, RGB uint8 (H, W, 3).
            mono_ns: When the observation was taken, on this host's monotonic clock (ns); now
                when omitted. Echoed back as `ChunkResult.obs_mono_ns`, the start of ``rtt_ns``.
            task: Task instruction (VLA prompt); the session's task when empty.
            inference_delay_steps: Steps the chunk's start will be late by (RTC).
            prefix_model: Leftover of the previous chunk in model space (RTC conditioning).
            prefix_robot: The same leftover in robot space.
            episode_start: Flags the first observation of an episode.

        Raises:
            SessionLost: the session is lost (or not open yet).
            WireError: a frame is not RGB uint8 (H, W, 3), naming its camera.
        """
        if self.lost.is_set():
            raise SessionLost(self.lost_reason)
        uplink = self._uplink
        assert uplink is not None, "declare() first"
        uplink.encoder.check(images)
        started = time.monotonic_ns()
        stamp = started if mono_ns is None else mono_ns
        job = Outgoing(
            header=self.protocol.observation(mono_ns=stamp, episode_start=episode_start),
            key=self.key,
            frames=dict(images),
            quality=self.codec.next(),
            state=encode_tensor(np.asarray(state, dtype=np.float32)),
            task=task,
            inference_delay_steps=int(inference_delay_steps),
            prefix_model=None if prefix_model is None else encode_tensor(prefix_model),
            prefix_robot=None if prefix_robot is None else encode_tensor(prefix_robot),
            started_ns=started,
            sizes=self.protocol.input_sizes,
        )
        self._result_ready = anyio.Event()
        return self._submit(uplink, job)

    def resend(self) -> int:
        """Send the request in flight again, under a new seq_id; returns it.

        For an answer that is overdue, most likely lost on the way (`servo.client.resend`): the
        first answer to either seq_id completes the request. The server answers the copy from
        what it holds of the original (`servo.server.copies`), so it costs a forward only when
        the observation never arrived. Counted in ``stats.resent`` and in the client's statistics.

        Raises:
            SessionLost: the session is lost.
            ValueError: no request in flight.
        """
        if self.lost.is_set():
            raise SessionLost(self.lost_reason)
        uplink, job = self._uplink, self._last_job
        if uplink is None or job is None:
            raise ValueError("no request in flight to send again")
        original = job.header
        header = self.protocol.observation(
            mono_ns=original.client_mono_ns, episode_start=bool(original.flags & FLAG_EPISODE_START), resend=True
        )
        return self._submit(uplink, dataclasses.replace(job, header=header, started_ns=time.monotonic_ns()))

    def resend_after(self, expected_rtt_ns: int | None) -> float | None:
        """`receive`'s ``resend_after`` (`servo.client.resend.ResendRule.copy_after`; None: never)."""
        return self.protocol.resend.copy_after(expected_rtt_ns)

    def _submit(self, uplink: Uplink, job: Outgoing) -> int:
        seq = job.header.seq_id
        self._last_job = job
        if not self._matched:
            self._send_failed(seq, "no server subscribes to this session's observations")
        else:
            uplink.submit(job).add_done_callback(lambda done: self._after_put(seq, done))
            self.stats.sent += 1
        return seq

    def _after_put(self, seq: int, done: Future[None]) -> None:
        """Observation ``seq`` left, or failed to (the uplink thread; the loop for a job refused at once).

        Only a failed put wakes the loop (a wake-up per request is a wait for a core on a busy
        machine). One that never ran was superseded (`Superseded`) or the session is closing
        (`StageClosed`): neither fails a request.
        """
        error = done.exception()
        if error is not None and not isinstance(error, NotRun):
            self._bridge.call(self._send_failed, seq, f"put failed: {error}")

    def _send_failed(self, seq: int, reason: str) -> None:
        """Event loop: observation ``seq`` never left; its `receive` fails now."""
        self.stats.send_failed += 1
        if (suppressed := self._send_throttle.allow(reason)) is not None:
            log.warning(
                "observation not sent", session_id=self.session_id, seq_id=seq, reason=reason, suppressed=suppressed
            )
        if self.protocol.fail(seq, SendFailed(f"observation {seq} not sent: {reason}")):
            self._result_ready.set()

    async def receive(self, seq_id: int, *, timeout: float, resend_after: float | None = None) -> ChunkResult:
        """Wait for the chunk answering ``seq_id`` (which must be the latest request).

        A chunk that arrives after a timeout is still delivered by a later call, as long as no
        newer request was sent. With ``resend_after`` (s, see `resend_after`) a request still
        unanswered then is sent again once (`resend`); the result's ``seq_id`` says which answered.

        Raises:
            RequestTimeout: nothing within ``timeout`` seconds.
            ServerError: the server answered with an error event.
            SessionLost: the server drained or vanished.
        """
        protocol = self.protocol
        if seq_id != protocol.latest_seq:
            raise ValueError(f"seq_id {seq_id} is not the latest request ({protocol.latest_seq})")
        # `_result_ready` is also set when the session is lost: one event, no helper tasks
        # (two watcher tasks in a task group cost ~0.1 ms per round trip).
        waits = [timeout]
        if resend_after is not None and resend_after < timeout:
            waits = [resend_after, timeout - resend_after]
        for turn, wait in enumerate(waits):
            if protocol.result is not None or self.lost.is_set():
                break
            if turn:
                seq_id = self.resend()
            with anyio.move_on_after(wait):
                await self._result_ready.wait()
        result = protocol.result
        if isinstance(result, ChunkResult):
            return result
        if isinstance(result, Exception):
            raise result
        if self.lost.is_set():
            raise SessionLost(self.lost_reason)
        if self._uplink is not None:
            self._uplink.record_cost(seq_id, time.monotonic_ns(), server_ms=0.0)  # what it cost to get nothing
        raise RequestTimeout(f"no chunk for seq {seq_id} within {timeout:.3g} s")

    async def infer(
        self,
        state: npt.ArrayLike,
        images: Mapping[str, npt.NDArray[np.uint8]],
        *,
        timeout: float = 5.0,
        resend_after: float | None = None,
        **observation: Unpack[ObservationOptions],
    ) -> ChunkResult:
        """`send` then `receive`: one round trip (`send`'s arguments, `receive`'s ``timeout`` and ``resend_after``)."""
        seq = await self.send(state, images, **observation)
        return await self.receive(seq, timeout=timeout, resend_after=resend_after)

    # ------------------------------------------------------------------ control plane
    async def reset(self, episode_id: int, *, timeout: float = 1.0) -> None:
        """Episode boundary on the server (acked). Later requests carry ``episode_id``.

        Raises:
            ServerError: the server refused (e.g. the session is unknown).
            RequestTimeout: no authenticated answer in time.
        """
        self.episode_id = episode_id
        await sealed_request(self._z, self.keys.control, self.protocol, ResetRequest(self.wire_id, episode_id), timeout)

    # ------------------------------------------------------------------ callbacks
    def _on_action(self, sample: zenoh.Sample) -> None:
        """The subscriber's callback thread: size the message, copy it out of Zenoh, hand it to the loop.

        The sizes are checked before the copy (`SessionProtocol.oversized`, which is pure); the
        protocol's state is only ever touched on the loop.
        """
        now = time.monotonic_ns()
        raw = sample.attachment
        refused = self.protocol.oversized(None if raw is None else len(raw), len(sample.payload))
        if refused is not None:
            self._bridge.call(self.protocol.refuse, refused)
            return
        self._bridge.call(self._on_message, None if raw is None else raw.to_bytes(), sample.payload.to_bytes(), now)

    def _on_message(self, attachment: bytes | None, payload: bytes, now_ns: int) -> None:
        """Event loop: act on what the protocol makes of one server message."""
        verdict = self.protocol.on_action(attachment, payload, now_ns)
        if isinstance(verdict, Lost):
            self._mark_lost(verdict.reason)
        elif isinstance(verdict, Answered):
            result = verdict.result
            if isinstance(result, ChunkResult) and self._uplink is not None:
                self._uplink.record_cost(result.seq_id, now_ns, server_ms=result.queue_wait_ms + result.inference_ms)
            self._result_ready.set()

    def _on_matching(self, matching: bool) -> None:
        self._matched = matching
        if matching:
            self._matching.set()
        elif self.protocol.in_flight is not None:
            self._send_failed(self.protocol.latest_seq, "the server's observation subscriber vanished")

    def _on_server_liveliness(self, sample: zenoh.Sample) -> None:
        if sample.kind == zenoh.SampleKind.PUT:
            self._server_seen = True
        elif self._server_seen:
            self._mark_lost("server liveliness lost")

    def _mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
            self._result_ready.set()  # wakes a pending `receive`
