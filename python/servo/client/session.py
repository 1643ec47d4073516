"""A session bound to one server replica: observations up, chunks down, one request in flight."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio
import numpy as np
import numpy.typing as npt
import zenoh

from servo._core import (
    FLAG_EPISODE_START,
    MSG_CHUNK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    SCHEMA_VERSION,
    Header,
    HeaderError,
    LatencyTracker,
    decode_header,
    unauthenticated,
)
from servo.client.errors import RequestTimeout, ServerError, SessionLost
from servo.client.replies import request
from servo.logs import get_logger
from servo.transport import LoopBridge, declare_obs_publisher, query
from servo.wire import (
    ActionChunk,
    ClientKeys,
    CloseRequest,
    ControlAck,
    EncodedImage,
    ErrorEvent,
    Observation,
    ResetRequest,
    ServerKeys,
    SessionAck,
    StatusReply,
    WireError,
    check_frame,
    decode,
    decode_tensor,
    encode,
    encode_image,
    encode_tensor,
)

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]

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


@dataclass
class SessionStats:
    """Counters of one session (written and read on the event loop).

    ``encode`` holds the encode times (ns) of the last `ENCODE_WINDOW` requests, ``last_encode_ms``
    the latest one: memory stays fixed however long the session runs.
    """

    sent: int = 0
    chunks: int = 0
    dropped_stale: int = 0
    errors: int = 0
    undecodable: int = 0
    last_encode_ms: float = 0.0
    encode: LatencyTracker = field(default_factory=lambda: LatencyTracker(ENCODE_WINDOW))


class RemoteSession:
    """One robot's session on one replica.

    Owned by the event loop task that drives it; Zenoh callbacks only hand samples to the loop.
    Enforces one request in flight: a chunk is accepted only if it answers the latest request
    of the current epoch; anything else is dropped and counted.
    """

    def __init__(
        self,
        zsession: zenoh.Session,
        server: ServerInfo,
        keys: ClientKeys,
        *,
        epoch: int,
        jpeg_quality: int,
    ) -> None:
        self.server = server
        self.keys = keys
        self.epoch = epoch
        self.ack: SessionAck | None = None
        self.jpeg_quality = jpeg_quality
        self.stats = SessionStats()
        self.episode_id = 0
        self.lost = anyio.Event()
        self.lost_reason = ""
        self._z = zsession
        self._bridge = LoopBridge()
        self._seq = 0
        self._latest_seq = 0
        self._result: ChunkResult | Exception | None = None
        self._result_ready = anyio.Event()
        self._matching = anyio.Event()
        self._server_seen = False
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

    async def close(self, *, timeout: float = 0.5) -> None:
        """Tell the server (best effort) and undeclare everything. Idempotent."""
        if self.ack is not None and not self.lost.is_set():
            with anyio.move_on_after(timeout):
                await query(
                    self._z,
                    self.keys.control,
                    payload=encode(CloseRequest(self.ack.session_id)),
                    timeout=timeout,
                )
        self._bridge.closed = True
        for entity in reversed(self._entities):
            with contextlib.suppress(zenoh.ZError):
                entity.undeclare()  # type: ignore[no-untyped-call]  # union defeats untyped_calls_exclude
        self._entities.clear()
        if self._publisher is not None:
            with contextlib.suppress(zenoh.ZError):
                self._publisher.undeclare()
            self._publisher = None
        self._mark_lost("closed")

    @property
    def session_id(self) -> int:
        """Server-assigned id (0 before the ack)."""
        return 0 if self.ack is None else self.ack.session_id

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
        """Encode (JPEG off the loop, one thread per camera) and publish one observation.

        A newer request supersedes any request still in flight. Returns its seq_id.

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
        started = time.perf_counter_ns()
        encoded = await _encode_images(images, self.jpeg_quality)
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
        encode_ns = time.perf_counter_ns() - started
        self.stats.encode.add(encode_ns)
        self.stats.last_encode_ms = encode_ns / 1e6
        self._seq += 1
        header = Header(
            schema_version=self.ack.schema_version if self.ack else SCHEMA_VERSION,
            msg_type=MSG_OBS,
            flags=FLAG_EPISODE_START if episode_start else 0,
            seq_id=self._seq,
            episode_id=self.episode_id,
            session_epoch=self.epoch,
            client_mono_ns=stamp,
            session_id=self.session_id.to_bytes(16, "little"),
        )
        self._latest_seq = self._seq
        self._result = None
        self._result_ready = anyio.Event()
        assert self._publisher is not None
        self._publisher.put(body, attachment=unauthenticated(header))
        self.stats.sent += 1
        return self._seq

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
            RequestTimeout: no answer in time.
        """
        self.episode_id = episode_id
        await request(
            self._z,
            self.keys.control,
            ResetRequest(self.session_id, episode_id),
            ControlAck,
            timeout=timeout,
            what="reset",
        )

    # ------------------------------------------------------------------ callbacks (event loop)
    def _on_matching(self, matching: bool) -> None:
        if matching:
            self._matching.set()

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
        now = time.monotonic_ns()
        try:
            attachment = sample.attachment
            if attachment is None:
                raise HeaderError("no attachment header")
            header = decode_header(attachment.to_bytes())
        except HeaderError as exc:
            self.stats.undecodable += 1
            log.warning("undecodable server message", session_id=self.session_id, error=str(exc))
            return
        if header.session_epoch != self.epoch:
            self.stats.dropped_stale += 1
            return
        if header.msg_type == MSG_DRAIN:
            self._mark_lost("server draining")
            return
        if header.seq_id != self._latest_seq or self._result is not None:
            # Late answer to a superseded request: merging it would corrupt the queue (one in flight).
            self.stats.dropped_stale += 1
            return
        try:
            if header.msg_type == MSG_CHUNK:
                self._result = self._chunk(header, sample.payload.to_bytes(), now)
                self.stats.chunks += 1
            elif header.msg_type == MSG_ERROR:
                event = decode(sample.payload.to_bytes(), ErrorEvent)
                self._result = ServerError(event.code, event.message)
                self.stats.errors += 1
            else:
                return
        except WireError as exc:
            self.stats.undecodable += 1
            self._result = ServerError("undecodable", str(exc))
        self._result_ready.set()

    def _chunk(self, header: Header, payload: bytes, now_ns: int) -> ChunkResult:
        body = decode(payload, ActionChunk)
        shape = (None, None)
        return ChunkResult(
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            chunk_model=decode_tensor(body.chunk_model, dtype="float32", shape=shape, what="chunk_model"),  # type: ignore[arg-type]
            chunk_robot=decode_tensor(body.chunk_robot, dtype="float32", shape=shape, what="chunk_robot"),  # type: ignore[arg-type]
            obs_mono_ns=header.client_mono_ns,
            rtt_ns=now_ns - header.client_mono_ns,
            queue_wait_ms=body.queue_wait_ms,
            inference_ms=body.inference_ms,
            superseded=body.superseded,
            server_load=body.server_load,
        )


async def _encode_images(frames: Mapping[str, npt.NDArray[np.uint8]], quality: int) -> dict[str, EncodedImage]:
    # Checked here, before any camera is handed to a thread: a bad frame is one WireError naming
    # its camera, not an exception group out of the encoding task group.
    for name, frame in frames.items():
        check_frame(frame, what=f"camera {name!r}")
    if quality == 0 or len(frames) <= 1:
        return {name: await _encode_one(frame, quality) for name, frame in frames.items()}
    out: dict[str, EncodedImage] = {}

    async def one(name: str, frame: npt.NDArray[np.uint8]) -> None:
        out[name] = await _encode_one(frame, quality)

    async with anyio.create_task_group() as tg:
        for name, frame in frames.items():
            tg.start_soon(one, name, frame)
    return {name: out[name] for name in frames}


async def _encode_one(frame: npt.NDArray[np.uint8], quality: int) -> EncodedImage:
    if quality == 0:
        return encode_image(frame, 0)  # no compression: a zero-copy view, nothing to offload
    return await anyio.to_thread.run_sync(encode_image, frame, quality)
