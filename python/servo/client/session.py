"""A session bound to one server replica: observations up, chunks down, one request in flight.

Every message of the session is authenticated with the session key the handshake derived
(`servo._core.SessionKey`): observations and control requests are sealed here; a server message
is acted on only once it verified (`servo.client.verify` lists the checks and counts refusals).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import anyio
import numpy as np
import numpy.typing as npt
import zenoh

from servo._core import (
    ATTACHMENT_SIZE,
    FLAG_EPISODE_START,
    MSG_CHUNK,
    MSG_CONTROL,
    MSG_CONTROL_ACK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    SCHEMA_VERSION,
    TAG_SIZE,
    AuthError,
    Header,
    HeaderError,
    LatencyTracker,
    SessionKey,
    decode_header,
)
from servo.client.codec import AutoCodec, CodecChooser, CodecStatus, codec_name
from servo.client.encoder import FrameEncoder
from servo.client.errors import RequestTimeout, SendFailed, ServerError, SessionLost
from servo.client.replies import rejection_of
from servo.client.verify import MAX_CHUNK_STEPS, ChunkRejected, ClientCounters, check_chunk
from servo.logs import LogThrottle, get_logger
from servo.transport import LoopBridge, declare_obs_publisher, query
from servo.wire import (
    ActionChunk,
    ClientKeys,
    CloseRequest,
    ControlAck,
    ControlRequest,
    ErrorEvent,
    Observation,
    Rejection,
    ResetRequest,
    ServerKeys,
    SessionAck,
    StatusReply,
    WireError,
    decode,
    encode,
    encode_tensor,
    resume_body,
)

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]

#: Room in a server message beyond its chunk tensors (header fields, an error's text): anything
#: larger on the action key is dropped before it is copied out of Zenoh.
MESSAGE_SLACK_BYTES = 1 << 20
#: Encode times kept for `SessionStats.encode` (a fixed window, whatever the uptime).
ENCODE_WINDOW = 1000


@dataclass(frozen=True)
class ServerInfo:
    """One replica as discovered: its keys and its status."""

    keys: ServerKeys
    status: StatusReply


@dataclass(frozen=True)
class ChunkResult:
    """A chunk with its timings. ``obs_mono_ns`` is the client's own stamp, echoed back."""

    seq_id: int
    episode_id: int
    chunk_model: FloatArray
    chunk_robot: FloatArray
    obs_mono_ns: int
    rtt_ns: int
    queue_wait_ms: float
    inference_ms: float
    superseded: int
    server_load: float


@dataclass(frozen=True)
class _Sent:
    """The request in flight as the codec chooser needs it (`time.monotonic_ns` stamps)."""

    seq_id: int
    quality: int
    started_ns: int
    encode_ms: float
    nbytes: int


@dataclass
class SessionStats:
    """Counters of one session (written and read on the event loop).

    ``encode`` holds the encode times (ns) of the last `ENCODE_WINDOW` requests, ``last_encode_ms``
    the latest one: memory stays fixed however long the session runs. ``send_failed`` counts
    observations that never left (`SendFailed`).
    """

    sent: int = 0
    send_failed: int = 0
    chunks: int = 0
    dropped_stale: int = 0
    errors: int = 0
    undecodable: int = 0
    last_encode_ms: float = 0.0
    encode: LatencyTracker = field(default_factory=lambda: LatencyTracker(ENCODE_WINDOW))


class RemoteSession:
    """One robot's session on one replica.

    Owned by the event loop task that drives it; Zenoh callbacks only hand samples to the loop,
    and the session's sender thread seals and puts observations (a put lasts as long as the
    transfer: ~1 ms on loopback, ~150 ms for a raw observation on 100 Mbit/s) and reports a failed
    put back to the loop. Enforces one request in flight: a chunk is accepted only if it is authenticated by the session
    key and answers the latest request of the current epoch; anything else is dropped and counted
    (``counters``, shared with the `PolicyClient` that opened it).

    ::

        created ──declare()──► declared ──established(ack, key)──► open ──close() / lost──► lost
    """

    def __init__(
        self,
        zsession: zenoh.Session,
        server: ServerInfo,
        keys: ClientKeys,
        *,
        epoch: int,
        jpeg_quality: int | Literal["auto"],
        action_dim: int,
        counters: ClientCounters | None = None,
        max_chunk_steps: int = MAX_CHUNK_STEPS,
        auto_codec: AutoCodec | None = None,
    ) -> None:
        self.server = server
        self.keys = keys
        self.epoch = epoch
        self.ack: SessionAck | None = None
        #: Raw or JPEG (and which quality) for each request: fixed, or chosen from measured costs.
        self.codec = CodecChooser(jpeg_quality, auto_codec)
        self.action_dim = action_dim
        self.max_chunk_steps = max_chunk_steps
        # The largest chunk (both spaces, float32) plus room for the rest of any server message.
        self._max_message_bytes = 2 * max_chunk_steps * action_dim * 4 + MESSAGE_SLACK_BYTES
        self.counters = counters if counters is not None else ClientCounters()
        self.stats = SessionStats()
        self.episode_id = 0
        self.lost = anyio.Event()
        self.lost_reason = ""
        self._z = zsession
        self._bridge = LoopBridge()
        self._key: SessionKey | None = None
        self._wire_id = bytes(16)
        self._seq = 0
        self._control_seq = 0
        self._latest_seq = 0
        self._result: ChunkResult | Exception | None = None
        self._result_ready = anyio.Event()
        self._matching = anyio.Event()
        self._matched = False
        self._sender: ThreadPoolExecutor | None = None
        self._encoder = FrameEncoder()
        self._sent: _Sent | None = None
        self._server_seen = False
        self._send_throttle = LogThrottle(1.0)
        self._entities: list[zenoh.Subscriber[None] | zenoh.LivelinessToken | zenoh.MatchingListener[None]] = []
        self._publisher: zenoh.Publisher | None = None

    # ------------------------------------------------------------------ set-up / tear-down
    def declare(self) -> None:
        """Declare the action subscriber, observation publisher and liveliness entities.

        Done before the session-open query, so the server's first chunk cannot be lost to a
        subscription that has not propagated yet.
        """
        bridge = self._bridge
        self._entities.append(self._z.declare_subscriber(self.keys.action, lambda s: bridge.call(self._on_action, s)))
        self._publisher = declare_obs_publisher(self._z, self.keys.obs)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="servo-send")
        self._entities.append(
            self._publisher.declare_matching_listener(lambda status: bridge.call(self._on_matching, status.matching))
        )
        self._entities.append(self._z.liveliness().declare_token(self.keys.alive))
        self._entities.append(
            self._z.liveliness().declare_subscriber(
                self.server.keys.alive,
                lambda s: bridge.call(self._on_server_liveliness, s),
                history=True,
            )
        )

    async def wait_matched(self, timeout: float) -> bool:
        """Wait until the server's observation subscriber is known here (a put before that is lost)."""
        with anyio.move_on_after(timeout):
            await self._matching.wait()
        return self._matching.is_set()

    def established(self, ack: SessionAck, key: SessionKey) -> None:
        """The handshake is done: from now on messages are sealed and verified with ``key``."""
        self.ack, self._key, self._wire_id = ack, key, ack.session_id

    @property
    def key(self) -> SessionKey:
        """The session key (the handshake's secret result; never sent anywhere).

        Raises:
            SessionLost: before the handshake.
        """
        if self._key is None:
            raise SessionLost("the session is not open yet")
        return self._key

    def resume_proof(self, client_key: bytes) -> bytes:
        """A proof that this client held this session, for a new open on the same replica.

        Sealed with this session's key over the new handshake's ``client_key`` (see
        `servo.wire.trust.resume_body`); it lets the new session replace this one even when the
        close never reached the server. Empty before the handshake.
        """
        if self._key is None:
            return b""
        return self._key.seal(self._control_header(), resume_body(client_key))

    def codec_status(self) -> CodecStatus:
        """The codec chooser's snapshot, with each camera's latest encode time per quality."""
        per_camera = {f"{camera}/{codec_name(q)}": round(ms, 3) for (camera, q), ms in self._encoder.camera_ms.items()}
        return dataclasses.replace(self.codec.status(), camera_encode_ms=per_camera)

    async def close(self, *, timeout: float = 0.5) -> None:
        """Tell the server (best effort, sealed) and undeclare everything. Idempotent."""
        if self.ack is not None and not self.lost.is_set():
            with anyio.move_on_after(timeout):
                with contextlib.suppress(RequestTimeout, ServerError):
                    await self._control(CloseRequest(self._wire_id), timeout=timeout)
        self._bridge.closed = True
        for entity in reversed(self._entities):
            with contextlib.suppress(zenoh.ZError):
                entity.undeclare()  # type: ignore[no-untyped-call]  # union defeats untyped_calls_exclude
        self._entities.clear()
        if self._sender is not None:
            # A put blocked on a stalled link ends when Zenoh closes the link; nobody waits for it.
            self._sender.shutdown(wait=False, cancel_futures=True)
            self._sender = None
        self._encoder.close()
        if self._publisher is not None:
            with contextlib.suppress(zenoh.ZError):
                self._publisher.undeclare()
            self._publisher = None
        self._mark_lost("closed")

    @property
    def wire_id(self) -> bytes:
        """Server-assigned id as it travels in headers: 16 bytes (zero before the ack)."""
        return self._wire_id

    @property
    def session_id(self) -> str:
        """Server-assigned id: 32 lowercase hex characters ("" before the ack)."""
        return "" if self.ack is None else self._wire_id.hex()

    @property
    def in_flight(self) -> int | None:
        """seq_id of the request awaiting its chunk, if any."""
        return self._latest_seq if self._result is None and self._latest_seq else None

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
        """Encode (JPEG on the session's per-camera threads) and publish one observation.

        The codec is the pick of the session's `CodecChooser` (``codec``) for this request. A
        newer request supersedes any request still in flight. Returns its seq_id. The seal and
        the put run on the session's sender thread; an observation that cannot leave (no
        server subscribes to it, or the put fails) fails its `receive` at once with `SendFailed`
        and is counted in ``stats.send_failed``.

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
        """
        if self.lost.is_set():
            raise SessionLost(self.lost_reason)
        stamp = time.monotonic_ns() if mono_ns is None else mono_ns
        started = time.monotonic_ns()
        quality = self.codec.next()
        encoded = await self._encoder.encode(images, quality)
        body = encode(
            Observation(
                state=encode_tensor(np.asarray(state, dtype=np.float32)),
                images=encoded,
                task=task,
                inference_delay_steps=int(inference_delay_steps),
                prefix_model=None if prefix_model is None else encode_tensor(prefix_model),
                prefix_robot=None if prefix_robot is None else encode_tensor(prefix_robot),
            )
        )
        encode_ns = time.monotonic_ns() - started
        self.stats.encode.add(encode_ns)
        self.stats.last_encode_ms = encode_ns / 1e6
        self._seq += 1
        header = Header(
            schema_version=self._schema_version,
            msg_type=MSG_OBS,
            flags=FLAG_EPISODE_START if episode_start else 0,
            seq_id=self._seq,
            episode_id=self.episode_id,
            session_epoch=self.epoch,
            client_mono_ns=stamp,
            session_id=self._wire_id,
        )
        key, publisher, sender = self.key, self._publisher, self._sender
        assert publisher is not None
        assert sender is not None
        self._latest_seq = self._seq
        self._sent = _Sent(self._seq, quality, started, encode_ns / 1e6, sum(len(i.data) for i in encoded.values()))
        self._result = None
        self._result_ready = anyio.Event()
        if not self._matched:
            self._send_failed(self._seq, "no server subscribes to this session's observations")
        else:
            sender.submit(self._put, publisher, key, self._seq, header, body)
            self.stats.sent += 1
        return self._seq

    def _put(self, publisher: zenoh.Publisher, key: SessionKey, seq: int, header: Header, body: bytes) -> None:
        """Sender thread: seal (the MAC pass over the body) and put one observation."""
        try:
            publisher.put(body, attachment=key.seal(header, body))
        except zenoh.ZError as exc:
            self._bridge.call(self._send_failed, seq, f"put failed: {exc}")

    def _send_failed(self, seq: int, reason: str) -> None:
        """Event loop: observation ``seq`` never left; its `receive` fails now."""
        self.stats.send_failed += 1
        if (suppressed := self._send_throttle.allow(reason)) is not None:
            log.warning(
                "observation not sent", session_id=self.session_id, seq_id=seq, reason=reason, suppressed=suppressed
            )
        if seq == self._latest_seq and self._result is None:
            self._result = SendFailed(f"observation {seq} not sent: {reason}")
            self._result_ready.set()

    async def receive(self, seq_id: int, *, timeout: float) -> ChunkResult:
        """Wait for the chunk answering ``seq_id`` (which must be the latest request).

        A chunk that arrives after a timeout is still delivered by a later call, as long as no
        newer request was sent.

        Raises:
            RequestTimeout: nothing within ``timeout`` seconds.
            ServerError: the server answered with an error event.
            SessionLost: the server drained or vanished.
        """
        if seq_id != self._latest_seq:
            raise ValueError(f"seq_id {seq_id} is not the latest request ({self._latest_seq})")
        if self._result is None and not self.lost.is_set():
            # `_result_ready` is also set when the session is lost: one event, no helper tasks
            # (two watcher tasks in a task group cost ~0.1 ms per round trip).
            with anyio.move_on_after(timeout):
                await self._result_ready.wait()
        result = self._result
        if isinstance(result, ChunkResult):
            return result
        if isinstance(result, Exception):
            raise result
        if self.lost.is_set():
            raise SessionLost(self.lost_reason)
        self._codec_sample(seq_id, time.monotonic_ns(), server_ms=0.0)  # what it cost to get nothing
        raise RequestTimeout(f"no chunk for seq {seq_id} within {timeout:.3g} s")

    async def infer(
        self,
        state: npt.ArrayLike,
        images: Mapping[str, npt.NDArray[np.uint8]],
        *,
        mono_ns: int | None = None,
        task: str = "",
        timeout: float = 5.0,
        inference_delay_steps: int = 0,
        prefix_model: FloatArray | None = None,
        prefix_robot: FloatArray | None = None,
        episode_start: bool = False,
    ) -> ChunkResult:
        """`send` then `receive`: one round trip (the arguments are `send`'s, plus ``timeout``)."""
        seq = await self.send(
            state,
            images,
            mono_ns=mono_ns,
            task=task,
            inference_delay_steps=inference_delay_steps,
            prefix_model=prefix_model,
            prefix_robot=prefix_robot,
            episode_start=episode_start,
        )
        return await self.receive(seq, timeout=timeout)

    # ------------------------------------------------------------------ control plane
    async def reset(self, episode_id: int, *, timeout: float = 1.0) -> None:
        """Episode boundary on the server (acked). Later requests carry ``episode_id``.

        Raises:
            ServerError: the server refused (e.g. the session is unknown).
            RequestTimeout: no authenticated answer in time.
        """
        self.episode_id = episode_id
        await self._control(ResetRequest(self._wire_id, episode_id), timeout=timeout)

    @property
    def _schema_version(self) -> int:
        return self.ack.schema_version if self.ack else SCHEMA_VERSION

    def _control_header(self) -> Header:
        self._control_seq += 1
        return Header(
            self._schema_version, MSG_CONTROL, 0, self._control_seq, self.episode_id, self.epoch, 0, self._wire_id
        )

    async def _control(self, message: ControlRequest, *, timeout: float) -> ControlAck:
        """Send a sealed control request; return the first reply sealed by the session key.

        Forged or unverifiable acks are counted and skipped; a refusal (keyless by design) raises.
        """
        key = self.key
        header = self._control_header()
        body = encode(message)
        replies = await query(
            self._z, self.keys.control, payload=body, attachment=key.seal(header, body), timeout=timeout
        )
        rejection: Rejection | None = None
        for reply in replies:
            if reply.err is not None:
                rejection = rejection_of(reply) or rejection
                continue
            if reply.ok is None:
                continue
            try:
                payload = reply.ok.payload.to_bytes()
                attachment = reply.ok.attachment
                if attachment is None:
                    raise AuthError("no attachment")
                answered = key.open(attachment.to_bytes(), payload)
                if (answered.msg_type, answered.seq_id, answered.session_id) != (
                    MSG_CONTROL_ACK,
                    header.seq_id,
                    self._wire_id,
                ):
                    raise AuthError("the ack answers another request")
                return decode(payload, ControlAck)
            except (AuthError, HeaderError, WireError) as exc:
                self.counters.reject("mac", f"control ack: {exc}", session_id=self.session_id)
        if rejection is not None:
            raise ServerError(rejection.code, rejection.reason)
        raise RequestTimeout(f"{type(message).__name__} not answered within {timeout:g} s")

    # ------------------------------------------------------------------ callbacks (event loop)
    def _on_matching(self, matching: bool) -> None:
        self._matched = matching
        if matching:
            self._matching.set()
        elif self.in_flight is not None:
            self._send_failed(self._latest_seq, "the server's observation subscriber vanished")

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

    def _on_action(self, sample: zenoh.Sample) -> None:
        """Event loop: a message on our action key. Only what verifies may touch the request."""
        now = time.monotonic_ns()
        # Measured before anything is copied out of Zenoh: whoever can publish on this key must
        # not make the event loop copy a huge message.
        raw = sample.attachment
        if raw is not None and len(raw) != ATTACHMENT_SIZE:
            self.counters.reject("mac", f"attachment of {len(raw)} bytes", session_id=self.session_id)
            return
        if len(sample.payload) > self._max_message_bytes:
            detail = f"message of {len(sample.payload)} bytes exceeds {self._max_message_bytes}"
            self.counters.reject("undecodable", detail, session_id=self.session_id)
            return
        payload = sample.payload.to_bytes()
        attachment = None if raw is None else raw.to_bytes()
        try:
            header = self._authenticate(attachment, payload)
        except ChunkRejected as exc:
            self.counters.reject(exc.reason, str(exc), session_id=self.session_id)
            return
        if header is None:
            return  # a keyless hint, handled
        if header.msg_type == MSG_DRAIN:
            self._mark_lost("server draining")
            return
        if header.msg_type not in (MSG_CHUNK, MSG_ERROR):
            self.counters.reject("undecodable", f"msg_type {header.msg_type} on the action key")
            return
        if header.seq_id != self._latest_seq or self._result is not None:
            # Late or replayed answer: merging it would corrupt the queue (one in flight).
            self.stats.dropped_stale += 1
            self.counters.reject("stale_seq", f"seq {header.seq_id}, in flight {self.in_flight}")
            return
        try:
            if header.msg_type == MSG_CHUNK:
                self._result = chunk = self._chunk(header, payload, now)
                self.stats.chunks += 1
                self._codec_sample(header.seq_id, now, server_ms=chunk.queue_wait_ms + chunk.inference_ms)
            else:
                event = decode(payload, ErrorEvent)
                self._result = ServerError(event.code, event.message)
                self.stats.errors += 1
        except ChunkRejected as exc:
            self.stats.undecodable += 1
            self.counters.reject(exc.reason, str(exc), session_id=self.session_id, seq_id=header.seq_id)
            self._result = ServerError("bad_chunk", f"{exc.reason}: {exc}")
        except WireError as exc:
            self.stats.undecodable += 1
            self.counters.reject("undecodable", str(exc), session_id=self.session_id, seq_id=header.seq_id)
            self._result = ServerError("undecodable", str(exc))
        self._result_ready.set()

    def _codec_sample(self, seq_id: int, now_ns: int, *, server_ms: float) -> None:
        """Tell the codec chooser what request ``seq_id`` cost, the server's compute excluded."""
        sent = self._sent
        if sent is None or sent.seq_id != seq_id:
            return
        self._sent = None
        net_ms = (now_ns - sent.started_ns) / 1e6 - sent.encode_ms - server_ms
        self.codec.record(sent.quality, encode_ms=sent.encode_ms, net_ms=max(0.0, net_ms), nbytes=sent.nbytes)

    def _authenticate(self, attachment: bytes | None, payload: bytes) -> Header | None:
        """The verified header of a server message, or None for a keyless hint acted upon.

        Raises:
            ChunkRejected: ``mac``, ``session`` or ``epoch``.
        """
        if attachment is None or self._key is None:
            raise ChunkRejected("mac" if self._key else "session", "no attachment" if self._key else "no session yet")
        if attachment[-TAG_SIZE:] == bytes(TAG_SIZE):
            self._keyless_hint(attachment, payload)
            return None
        try:
            header = self._key.open(attachment, payload)
        except (AuthError, HeaderError) as exc:
            raise ChunkRejected("mac", str(exc)) from None
        if header.session_id != self._wire_id:
            raise ChunkRejected("session", f"session {header.session_id.hex()}, ours is {self.session_id}")
        if header.session_epoch != self.epoch:
            self.stats.dropped_stale += 1
            raise ChunkRejected("epoch", f"epoch {header.session_epoch}, ours is {self.epoch}")
        return header

    def _keyless_hint(self, attachment: bytes, payload: bytes) -> None:
        """A keyless notice counts only as the ``unknown_session`` hint for the request in flight.

        It re-opens the session (nothing more): a forger gains at most a re-handshake, and only
        by echoing the session id and seq_id of the request in flight.
        """
        event = None
        with contextlib.suppress(HeaderError, WireError):
            header = decode_header(attachment)
            # The cheap header checks first: an unauthenticated body is decoded only when it
            # could be the hint for the request in flight.
            if (header.msg_type, header.session_id, header.seq_id) == (MSG_ERROR, self._wire_id, self._latest_seq):
                event = decode(payload, ErrorEvent)
        if event is None or event.code != "unknown_session" or self._result is not None:
            self.counters.reject("mac", "unauthenticated message", session_id=self.session_id)
            return
        self.counters.unknown_session_hints += 1
        self._result = ServerError(event.code, event.message)
        self._result_ready.set()

    def _chunk(self, header: Header, payload: bytes, now_ns: int) -> ChunkResult:
        body = decode(payload, ActionChunk)
        chunk_model, chunk_robot = check_chunk(body, action_dim=self.action_dim, max_steps=self.max_chunk_steps)
        return ChunkResult(
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            chunk_model=chunk_model,
            chunk_robot=chunk_robot,
            obs_mono_ns=header.client_mono_ns,
            rtt_ns=now_ns - header.client_mono_ns,
            queue_wait_ms=body.queue_wait_ms,
            inference_ms=body.inference_ms,
            superseded=body.superseded,
            server_load=body.server_load,
        )
