"""Helpers for the server tests: observations, connected clients, a raw action-key tap."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Literal

import anyio
import numpy as np
import zenoh
from prometheus_client.parser import text_string_to_metric_families

from servo._core import MSG_OBS, SCHEMA_VERSION, AuthError, Header, HeaderError, SessionKey, decode_header
from servo.client import PolicyClient, RemoteSession
from servo.client.trust import signed_open
from servo.identity import Identity
from servo.server.manifest import Manifest, parse_manifest
from servo.server.service import PolicyServer, ServerReady
from servo.stages import LoopBridge
from servo.wire import SessionOpen
from tests.support import client_settings
from tests.support import eventually as eventually  # re-exported: tests/security/test_flood.py imports it here


def observation(
    state: float | np.ndarray,
    cameras: Mapping[str, tuple[int, int]] | None = None,
    *,
    dim: int = 6,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(state, images)`` for `RemoteSession.send` / ``infer``: ``state`` (a scalar fills every
    joint) and black frames of the given sizes."""
    cams = {"front": (24, 32)} if cameras is None else cameras
    values = np.full(dim, state, np.float32) if np.isscalar(state) else np.asarray(state, np.float32)
    frames = {name: np.zeros((h, w, 3), np.uint8) for name, (h, w) in cams.items()}
    return values, frames


def server_manifest(
    port: int, *, serving: str = "", ops: str = "health_port = 0", zenoh: str = "", extra: str = ""
) -> Manifest:
    """A manifest for an in-process server (the policy is injected, ``model.source`` unused);
    ``extra`` is appended as more tables (e.g. a front door)."""
    return parse_manifest(
        f"""
[model]
source = "injected"
warmup = 1
[serving]
{serving}
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
{zenoh}
[ops]
{ops}
{extra}
"""
    )


def cameras_of(ready: ServerReady) -> dict[str, tuple[int, int]]:
    return {name: (c.height, c.width) for name, c in ready.info.features.cameras.items()}


@asynccontextmanager
async def connected(
    port: int, client_id: str, *, jpeg_quality: int | Literal["auto"] = 0, identity: Identity | None = None
) -> AsyncIterator[PolicyClient]:
    """A client on the server at ``port``; it signs as this machine's robot unless given ``identity``."""
    settings = client_settings(port)
    async with PolicyClient.connect(settings, client_id, jpeg_quality=jpeg_quality, identity=identity) as client:
        yield client


async def signed(client: PolicyClient, ready: ServerReady, request: SessionOpen) -> SessionOpen:
    """A session open sent by hand, signed as ``client``'s robot with the nonce the server hands out now."""
    (server,) = [s for s in await client.discover() if s.keys == ready.keys]
    return signed_open(request, client.identity, prefix=ready.keys.prefix, nonce=server.status.nonce)


async def open_on(client: PolicyClient, ready: ServerReady, **options: object) -> RemoteSession:
    """Discover the (single) server and open a session with its own features and fps."""
    servers = [s for s in await client.discover() if s.keys == ready.keys]
    assert servers, "the test server did not answer discovery"
    options.setdefault("features", ready.info.features)
    options.setdefault("fps", ready.info.fps)
    return await client.open_session(servers[0], **options)  # type: ignore[arg-type]


def metric(server: PolicyServer, name: str, **labels: str) -> float:
    """Current value of one Prometheus sample of the server, as its /metrics shows it (0 when absent)."""
    return sample(server.metrics.render(), name, **labels)


def sample(exposition: bytes, name: str, **labels: str) -> float:
    """One sample's value in Prometheus text (0 when absent)."""
    for family in text_string_to_metric_families(exposition.decode()):
        for each in family.samples:
            if each.name == name and each.labels == labels:
                return float(each.value)
    return 0.0


def obs_header(session: RemoteSession, seq_id: int, **changes: int | bytes) -> Header:
    """A valid observation header for ``session``, with fields overridden."""
    header = Header(
        schema_version=SCHEMA_VERSION,
        msg_type=MSG_OBS,
        flags=0,
        seq_id=seq_id,
        episode_id=session.episode_id,
        session_epoch=session.epoch,
        client_mono_ns=time.monotonic_ns(),
        session_id=bytes.fromhex(session.session_id),
    )
    return header.replace(**changes) if changes else header


def sealed(session: RemoteSession, seq_id: int, body: bytes, **changes: int | bytes) -> tuple[bytes, bytes]:
    """``(attachment, ciphertext)`` of an observation ``body`` encrypted with ``session``'s key (what its
    client sends), for ``session.zsession.put(key, ciphertext, attachment=attachment)``.

    A key never encrypts one seq_id twice (its nonce would repeat), so the session's own next
    observation takes a seq_id above ``seq_id``, as if its client had sent this one.
    """
    protocol = session.protocol
    protocol._seq = max(protocol._seq, seq_id)  # the client's own counter: it sent this one
    return session.key.encrypt(obs_header(session, seq_id, **changes), body)


@asynccontextmanager
async def observation_tap(zsession: zenoh.Session, key: str) -> AsyncIterator[list[tuple[bytes, bytes]]]:
    """Every observation put on ``key`` while open, as sent: ``(attachment, ciphertext)`` (to replay them)."""
    bridge = LoopBridge()
    seen: list[tuple[bytes, bytes]] = []

    def on(sample: zenoh.Sample) -> None:
        if not bridge.closed and sample.attachment is not None:
            seen.append((sample.attachment.to_bytes(), sample.payload.to_bytes()))

    sub = zsession.declare_subscriber(key, lambda s: bridge.call(on, s))
    try:
        yield seen
    finally:
        bridge.close()
        sub.undeclare()


class ActionTap:
    """Everything the server publishes on one client's action key, as (header, body) pairs.

    With ``key`` (the client's session key) a message it decrypts is seen with its plaintext body;
    any other (keyless notices, foreign messages) with its header as it claims and its body as sent.
    The subscriber callback only hands samples to the event loop; `next` waits on the loop.
    """

    def __init__(self, zsession: zenoh.Session, key: str, session_key: SessionKey | None = None) -> None:
        self._session_key = session_key
        self._bridge = LoopBridge()
        self._send, self._recv = anyio.create_memory_object_stream[tuple[Header | None, bytes]](1000)
        self._sub = zsession.declare_subscriber(key, lambda s: self._bridge.call(self._on, s))
        self.seen: list[tuple[Header | None, bytes]] = []

    def _on(self, sample: zenoh.Sample) -> None:
        if self._bridge.closed:
            return  # scheduled on the loop just before `close`: the tap is gone
        header: Header | None
        attachment = None if sample.attachment is None else sample.attachment.to_bytes()
        payload = sample.payload.to_bytes()
        if attachment is not None and self._session_key is not None:
            with contextlib.suppress(AuthError, HeaderError):
                self._send.send_nowait(self._session_key.decrypt(attachment, payload))
                return
        try:
            header = None if attachment is None else decode_header(attachment)
        except HeaderError:
            header = None
        self._send.send_nowait((header, payload))

    async def next(
        self, predicate: Callable[[Header | None], bool], *, timeout: float = 5.0
    ) -> tuple[Header | None, bytes]:
        """The next message whose header satisfies ``predicate`` (others are kept in `seen`)."""
        with anyio.fail_after(timeout):
            while True:
                item = await self._recv.receive()
                self.seen.append(item)
                if predicate(item[0]):
                    return item

    def close(self) -> None:
        self._bridge.close()
        self._sub.undeclare()
        self._send.close()
        self._recv.close()


@asynccontextmanager
async def action_tap(
    zsession: zenoh.Session, key: str, session_key: SessionKey | None = None
) -> AsyncIterator[ActionTap]:
    tap = ActionTap(zsession, key, session_key)
    try:
        yield tap
    finally:
        tap.close()
