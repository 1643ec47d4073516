"""Hostile peers for the attack tests, reusable by later ones (floods, fuzzers).

Everything here joins the same flat Zenoh network as the server and the robot (client mode on
the server's listening endpoint: a peer forwards between its clients, there is no router and no
access control) and does what an attacker on that network can: subscribe to anything, publish on
any key, answer any query, declare any token. What it cannot do is hold a key it was not given.

* `Tap`: records what is published on a key expression (the attacker's sniffer); `Capture`
  records the queries sent to someone else's queryable key (the victim's control requests).
* `ChunkForger`: answers every observation of a robot at once with a forged chunk, echoing the
  observation's header (the attack of issue 8: the robot executed the forger's targets).
* Notice forgers (`NoticeForger`, `NoticeOracle`) live in `tests.security.notice_peers`.
* `RogueReplica`: poses as a server replica; its status, its session ack and its chunks are
  whatever the test makes them (unsigned, signed by another identity, load -1, invalid UTF-8…).
  With ``handshake=True`` it completes a genuine key exchange under its own identity: a key
  holder that sends hostile chunks (a buggy or compromised server), so the edge's validation
  behind the MAC can be attacked too.
* `edge_rig`: a real edge (EdgeRuntime, remote engine, simulated arm) recording every tick, with
  every merged chunk logged, for "the robot never executed it" assertions.

Callbacks only record (under a lock) or answer at once; tests read with `Tap.wait_for`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np
import zenoh
from zenoh.handlers import Callback

from servo._core import (
    MSG_CHUNK,
    SCHEMA_VERSION,
    Header,
    HeaderError,
    ServerIdentity,
    SessionKey,
    decode_header,
    unauthenticated,
)
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.edge.telemetry import TelemetryPublisher
from servo.policy.compatibility import describe
from servo.recording import Recording, read_recording
from servo.server.auth import SessionAuth, accept_handshake
from servo.transport import ZenohSettings
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    ActionChunk,
    PolicyInfo,
    ServerKeys,
    SessionAck,
    SessionOpen,
    StatusReply,
    WireError,
    decode,
    encode,
    encode_tensor,
)
from tests.edge.harness import MergeLog, RuntimeRun, edge_config, running_edge, small_sim
from tests.server.policies import FixedComputePolicy, make_spec

WAIT_S = 5.0
#: The simulated arm of the rig: six SO-100 joints and one 48x64 camera.
SIM = small_sim().spec()


def peer_settings(port: int) -> ZenohSettings:
    """An attacker joining the server's endpoint like any robot does."""
    return ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"])


def host_settings(port: int) -> ZenohSettings:
    """A hostile peer that is the endpoint the robot dials (no real server on the network)."""
    return ZenohSettings(mode="peer", listen=[f"tcp/127.0.0.1:{port}"])


def sim_policy_spec(**overrides: Any) -> dict[str, Any]:
    """`FixedComputePolicy` options that fit the rig's simulated arm."""
    return {"joints": tuple(SIM.joint_names), "cameras": {"front": (48, 64)}, **overrides}


def make_sim_policy(compute_ms: float = 10.0, chunk_size: int = 20, **_: Any) -> FixedComputePolicy:
    """A manifest's factory (``tests.security.peers:make_sim_policy``) of a policy fitting the rig's arm."""
    return FixedComputePolicy(compute_ms=compute_ms, **sim_policy_spec(chunk_size=chunk_size))


@dataclass(frozen=True)
class Seen:
    """One message a `Tap` recorded."""

    key: str
    attachment: bytes | None
    payload: bytes

    @property
    def header(self) -> Header | None:
        """The header the attachment claims (unauthenticated), if it decodes."""
        if self.attachment is None:
            return None
        try:
            return decode_header(self.attachment)
        except HeaderError:
            return None


class Tap:
    """Everything published on ``selector``, recorded on Zenoh's receive thread."""

    def __init__(self, z: zenoh.Session, selector: str) -> None:
        self._cond = threading.Condition()
        self.seen: list[Seen] = []
        self._sub = z.declare_subscriber(selector, Callback(self._on, indirect=False))

    def _on(self, sample: zenoh.Sample) -> None:
        attachment = None if sample.attachment is None else sample.attachment.to_bytes()
        with self._cond:
            self.seen.append(Seen(str(sample.key_expr), attachment, sample.payload.to_bytes()))
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[Seen], bool], timeout: float = WAIT_S) -> Seen:
        """The first recorded message satisfying ``predicate`` (blocking: call off the loop or briefly)."""
        with self._cond:
            found: list[Seen] = []

            def match() -> bool:
                found[:] = [s for s in self.seen if predicate(s)][:1]
                return bool(found)

            if not self._cond.wait_for(match, timeout):
                raise AssertionError(f"nothing matching arrived within {timeout} s; saw {len(self.seen)} messages")
            return found[0]

    def close(self) -> None:
        self._sub.undeclare()


class Capture:
    """A queryable on someone else's key (possible on a flat network): records queries, never answers."""

    def __init__(self, z: zenoh.Session, key: str) -> None:
        self.queries: list[tuple[bytes, bytes | None]] = []
        self.arrived = threading.Event()
        self._q = z.declare_queryable(key, Callback(self._on, indirect=False))

    def _on(self, q: zenoh.Query) -> None:
        with q:
            attachment = None if q.attachment is None else q.attachment.to_bytes()
            self.queries.append((b"" if q.payload is None else q.payload.to_bytes(), attachment))
            self.arrived.set()

    def close(self) -> None:
        self._q.undeclare()


def echo(request: Seen | Header, msg_type: int, body: bytes, *, secret: bytes | None = None) -> tuple[bytes, bytes]:
    """``(attachment, payload)`` answering ``request`` (its header echoed): unauthenticated, or
    encrypted under a session secret the attacker guessed."""
    header = request if isinstance(request, Header) else request.header
    assert header is not None
    reply = header.replace(msg_type=msg_type, flags=0)
    if secret is None:
        return unauthenticated(reply), body
    return SessionKey(secret, role="server").encrypt(reply, body)


def chunk_body(values: np.ndarray) -> bytes:
    """An `ActionChunk` body carrying ``values`` as its robot-space chunk."""
    return encode(ActionChunk(encode_tensor(values), queue_wait_ms=0.0, inference_ms=0.0))


class ChunkForger:
    """Answers observations on ``obs_selector`` at once with a forged message (a chunk of ``value``).

    Publishes on the matching action key from its receive callback, before any server can
    answer, echoing the observation's header. ``secret`` is the forger's guess at the session
    secret (None: unauthenticated); ``body`` and ``msg_type`` replace the chunk (e.g. a keyless
    error notice); ``limit`` stops after that many answers.
    """

    def __init__(
        self,
        z: zenoh.Session,
        obs_selector: str,
        value: float = 0.0,
        *,
        secret: bytes | None = None,
        body: bytes | None = None,
        msg_type: int = MSG_CHUNK,
        limit: int | None = None,
    ) -> None:
        self.forged = 0
        self._z, self._secret, self._msg_type, self._limit = z, secret, msg_type, limit
        self._body = body if body is not None else chunk_body(np.full((20, len(SIM.joint_names)), value, np.float32))
        self._sub = z.declare_subscriber(obs_selector, Callback(self._answer, indirect=False))

    def _answer(self, sample: zenoh.Sample) -> None:
        if sample.attachment is None or (self._limit is not None and self.forged >= self._limit):
            return
        seen = Seen(str(sample.key_expr), sample.attachment.to_bytes(), b"")
        if seen.header is None:
            return
        action_key = seen.key.rsplit("/", 1)[0] + "/action"
        attachment, payload = echo(seen, self._msg_type, self._body, secret=self._secret)
        self._z.put(action_key, payload, attachment=attachment)
        self.forged += 1

    def close(self) -> None:
        self._sub.undeclare()


@dataclass
class RogueReplica:
    """A peer posing as replica ``keys``: status, session open and (with a handshake) chunks.

    ``status`` builds the status reply body (any bytes: undecodable ones poison discovery);
    ``ack`` turns a decoded `SessionOpen` and the genuine handshake fields into the ack it sends
    (forge a signature, an identity, …). With ``chunks``, every observation of a session it
    acked is answered with ``chunks(seq)`` (an array, or a raw body) encrypted with the derived
    key and numbered ``reply_seq(seq)``: a key holder sending what it likes (a seq it answered
    already is answered with that same message again: its key never repeats a nonce).
    """

    z: zenoh.Session
    keys: ServerKeys
    status: Callable[[StatusReply], bytes] = encode
    ack: Callable[[SessionOpen, SessionAck], SessionAck] = lambda _request, genuine: genuine
    chunks: Callable[[int], np.ndarray | bytes] | None = None
    reply_seq: Callable[[int], int] = lambda seq: seq
    identity: ServerIdentity = field(default_factory=ServerIdentity.generate)
    load: float = 0.0
    opens: int = 0
    _sessions: dict[str, SessionAuth] = field(default_factory=dict)
    _sent: dict[tuple[str, int], tuple[bytes, bytes]] = field(default_factory=dict)
    _entities: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        z, keys = self.z, self.keys
        self._entities = [
            z.declare_queryable(keys.status, Callback(self._status, indirect=False)),
            z.declare_queryable(keys.all_sessions, Callback(self._open, indirect=False)),
            z.liveliness().declare_token(keys.alive),
        ]
        if self.chunks is not None:
            self._entities.append(z.declare_subscriber(keys.all_obs, Callback(self._observation, indirect=False)))

    @property
    def info(self) -> PolicyInfo:
        return describe(make_spec(**sim_policy_spec(chunk_size=20)), serving_mode="shared")

    def genuine_status(self) -> StatusReply:
        return StatusReply(
            "rogue",
            self.keys.app,
            self.keys.model,
            self.keys.replica,
            list(SUPPORTED_SCHEMA_VERSIONS),
            self.info,
            True,
            False,
            0,
            8,
            max(self.load, 0.0),
            self.identity.public_key,
        )

    def _status(self, query: zenoh.Query) -> None:
        with query:
            query.reply(self.keys.status, self.status(self.genuine_status()))

    def _open(self, query: zenoh.Query) -> None:
        with query:
            try:
                request = decode(b"" if query.payload is None else query.payload.to_bytes(), SessionOpen)
            except WireError:
                return
            self.opens += 1
            handshake = accept_handshake(request, self.identity, self.keys.replica)
            self._sessions[request.client_id] = handshake.auth
            genuine = SessionAck(
                handshake.auth.wire_id,
                SCHEMA_VERSION,
                "rogue",
                self.keys.replica,
                self.info,
                False,
                "",
                handshake.server_key,
                self.identity.public_key,
                handshake.signature,
            )
            query.reply(str(query.key_expr), encode(self.ack(request, genuine)))

    def _observation(self, sample: zenoh.Sample) -> None:
        client = str(sample.key_expr).rsplit("/", 2)[1]
        auth = self._sessions.get(client)
        if auth is None or sample.attachment is None or self.chunks is None:
            return
        header, _ = auth.key.decrypt(sample.attachment.to_bytes(), sample.payload.to_bytes())
        produced = self.chunks(header.seq_id)
        body = produced if isinstance(produced, bytes) else chunk_body(produced)
        reply = header.replace(msg_type=MSG_CHUNK, flags=0, seq_id=self.reply_seq(header.seq_id))
        sent = self._sent.get((client, reply.seq_id))
        if sent is None:
            sent = self._sent[client, reply.seq_id] = auth.key.encrypt(reply, body)
        self.z.put(self.keys.client(client).action, sent[1], attachment=sent[0])

    def close(self) -> None:
        for entity in reversed(self._entities):
            entity.undeclare()


class Closable(Protocol):
    def close(self) -> None: ...


@contextmanager
def closing(*things: Closable) -> Iterator[None]:
    """Undeclare the attackers' entities at the end of the block."""
    try:
        yield
    finally:
        for thing in things:
            thing.close()


def with_status(**changes: Any) -> Callable[[StatusReply], bytes]:
    """A status encoder that changes fields after construction (bypassing validation)."""

    def build(status: StatusReply) -> bytes:
        raw = msgspec.to_builtins(status, builtin_types=(bytes,))
        raw.update(changes)
        return msgspec.msgpack.encode(raw)

    return build


@dataclass
class EdgeRig:
    """A real edge streaming from whatever answers on the port; see `edge_rig`."""

    engine: RemoteEngine
    run: RuntimeRun
    merges: MergeLog
    record: Path
    summary_file: Path
    summary: Any = None

    def recording(self) -> Recording:
        return read_recording(self.record)


@asynccontextmanager
async def edge_rig(
    port: int,
    tmp_path: Path,
    client_id: str = "robot-7",
    *,
    telemetry: TelemetryPublisher | None = None,
    **config: Any,
) -> AsyncIterator[EdgeRig]:
    """A real edge (remote engine, simulated arm, a recording of every tick, ``telemetry`` if given) on ``port``.

    The rig is stopped (and the arm parked) when the block ends; ``rig.summary`` then holds the
    run summary (also written to ``rig.summary_file``).
    """
    sim = small_sim()
    engine = RemoteEngine(edge_config(port, client_id=client_id, **config), sim.spec())
    merges = MergeLog.attach(engine)
    record = tmp_path / f"{client_id}-{time.monotonic_ns()}.servo"
    summary = record.with_suffix(".json")
    options = RunOptions(record_path=str(record), summary_path=str(summary), telemetry=telemetry)
    async with running_edge(sim, engine, options) as run:
        rig = EdgeRig(engine, run, merges, record, summary)
        yield rig
        rig.summary = await run.stop()
