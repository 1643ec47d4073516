"""The monitor's Zenoh side: it joins the network like any member (behind a router, as a ``monitor``).

What it declares and asks is exactly what the router lets a monitor do (`servo.router.acl`):
a subscriber on every robot's telemetry, a liveliness subscriber on the replicas' tokens, the
replicas' ``status`` queryables once a second and their ``audit`` queryables (a robot's recent
requests when a person opens its timeline; every replica's refused requests every few seconds).
It never puts, answers or declares anything. Zenoh callbacks only copy bytes (bounded) and hand
them to the event loop; verification and everything else happen there (`FleetView`).

A status reply counts only when signed, over the nonce this poll sent, by an identity the monitor
trusts for that replica (`RobotTrust.server_trusted`); only such replicas are asked for their
audit, as the monitor's operator identity (`servo.client.audit`: the answer is sealed to the
monitor and signed by that replica), and the enrolled robots a trusted replica lists there become
robots whose telemetry the monitor believes. Anything else is counted (``unverified``) and shown
nowhere.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any

import anyio
import zenoh
from anyio.abc import TaskStatus
from zenoh.handlers import Callback

from servo._core import SIGNATURE_SIZE, verify_signature
from servo.client.audit import ask_audit
from servo.client.discovery import ServerInfo
from servo.client.errors import RequestTimeout, RogueServer, ServerError
from servo.identity import Identity
from servo.logs import get_logger
from servo.monitor.fleet import FleetView
from servo.stages import LoopBridge
from servo.transport import direct, query
from servo.wire import (
    MAX_STATUS_BYTES,
    NONCE_SIZE,
    TELEMETRY_SELECTOR,
    AuditQuery,
    AuditTail,
    ServerKeys,
    StatusReply,
    WireError,
    alive_selector,
    decode,
    status_selector,
    status_transcript,
)
from servo.wire.telemetry import MAX_TELEMETRY_BYTES

log = get_logger(__name__)

#: How often replicas are asked for their status, and for the requests they refused (s).
STATUS_PERIOD_S = 1.0
REFUSALS_PERIOD_S = 5.0
#: Query deadline (s): a replica that does not answer in time is left out of that round.
QUERY_TIMEOUT_S = 1.0
#: Server-side refusals remembered to report each one once.
_SEEN_REFUSALS = 4096


class FleetCollector:
    """Feeds a `FleetView` from the Zenoh network. Owned by the event loop (`run` is its task).

    Args:
        view: What the monitor knows.
        zsession: The monitor's Zenoh session (closed by whoever opened it).
        identity: The monitor's operator identity (signs its audit queries).
    """

    def __init__(self, view: FleetView, zsession: zenoh.Session, identity: Identity) -> None:
        self.view = view
        self.zsession = zsession
        self.identity = identity
        #: The replicas whose signed status a trusted identity made, as last polled.
        self.statuses: dict[str, ServerInfo] = {}
        #: Telemetry samples dropped in the callback because they were too large to be telemetry.
        self.oversized = 0
        self._seen_refusals: dict[tuple[str, str, int], None] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Subscribe and poll until cancelled; ``started`` once subscribed and first polled."""
        bridge = LoopBridge()
        declared: list[Any] = []
        try:
            on_token: Callback[zenoh.Sample] = direct(
                lambda s: bridge.call(self._on_token, str(s.key_expr), s.kind == zenoh.SampleKind.PUT)
            )
            # Telemetry keeps a thread of its own: a fleet's records arrive at N per second, and a
            # `direct` callback would hold Zenoh's receive path while it waits for the GIL.
            declared.append(self.zsession.declare_subscriber(TELEMETRY_SELECTOR, lambda s: self._on_sample(bridge, s)))
            declared.append(self.zsession.liveliness().declare_subscriber(alive_selector(), on_token, history=True))
            await self.poll_status()
            task_status.started()
            next_refusals = 0.0
            while True:
                await anyio.sleep(STATUS_PERIOD_S)
                await self.poll_status()
                self.view.prune()
                if (state := self.view.trust.changed_state()) is not None:
                    await anyio.to_thread.run_sync(self.view.trust.write_state, state)  # a file write: off the loop
                if time.monotonic() >= next_refusals:
                    next_refusals = time.monotonic() + REFUSALS_PERIOD_S
                    await self.poll_refusals()
        finally:
            bridge.close()
            for entity in reversed(declared):
                with contextlib.suppress(zenoh.ZError):
                    entity.undeclare()

    def _on_sample(self, bridge: LoopBridge, sample: zenoh.Sample) -> None:
        """Zenoh's callback thread: copy a bounded sample out and hand it to the loop."""
        if len(sample.payload) > MAX_TELEMETRY_BYTES:
            self.oversized += 1
            return
        attachment = None if sample.attachment is None else sample.attachment.to_bytes()
        bridge.call(self.view.on_telemetry, str(sample.key_expr), sample.payload.to_bytes(), attachment)

    def _on_token(self, key: str, alive: bool) -> None:
        prefix = key.removesuffix("/alive")
        if prefix.count("/") == 3:
            self.view.on_replica_token(prefix, alive)

    async def poll_status(self) -> None:
        """Ask every replica for its status; only one signed for this poll by a trusted identity counts."""
        nonce = secrets.token_bytes(NONCE_SIZE)
        for reply in await query(self.zsession, status_selector(), payload=nonce, timeout=QUERY_TIMEOUT_S):
            if reply.ok is None:
                continue
            try:
                keys = ServerKeys.parse_status(str(reply.ok.key_expr))
                body = reply.ok.payload.to_bytes()
                status = decode(body, StatusReply, max_bytes=MAX_STATUS_BYTES)
            except WireError as exc:
                log.debug("status reply skipped", error=str(exc))
                continue
            signature = b"" if reply.ok.attachment is None else reply.ok.attachment.to_bytes()
            if (
                status.replica == keys.replica
                and len(signature) == SIGNATURE_SIZE
                and verify_signature(status.identity, status_transcript(nonce, body), signature)
                and self.view.trust.server_trusted(keys.prefix, status.identity)
            ):
                self.statuses[keys.prefix] = ServerInfo(keys, status)
                self.view.on_status(keys.prefix, status)
            else:
                self.view.unverified(keys.replica, f"status of {keys.prefix} not signed by an identity trusted for it")

    async def audit(self, request: AuditQuery) -> list[tuple[str, AuditTail]]:
        """Every trusted replica's answer to ``request``: ``(replica key prefix, tail)``; refused ones skipped."""
        tails: list[tuple[str, AuditTail]] = []

        async def ask(server: ServerInfo) -> None:
            try:
                tail = await ask_audit(
                    self.zsession, server.keys, server.status, self.identity, request, timeout=QUERY_TIMEOUT_S
                )
            except (ServerError, RogueServer, RequestTimeout, WireError) as exc:
                log.debug("audit not answered", replica=server.keys.prefix, error=str(exc))
                return
            self.view.trust.learn_roster(tail.robots)
            tails.append((server.keys.prefix, tail))

        async with anyio.create_task_group() as tg:
            for server in list(self.statuses.values()):
                if server.keys.prefix in self.view.replicas:
                    tg.start_soon(ask, server)
        return tails

    async def requests(self, robot: str, limit: int = 128) -> list[dict[str, Any]]:
        """``robot``'s recent requests on every replica, oldest first, timed on this machine's clock."""
        asked = time.time()
        rows = []
        for prefix, tail in await self.audit(AuditQuery(robot, limit=limit)):
            for e in tail.entries:
                rows.append(
                    {
                        "t": asked - e.age_ms / 1e3,
                        "replica": prefix.rsplit("/", 1)[-1],
                        "session": e.session_id,
                        "seq": e.seq_id,
                        "episode": e.episode_id,
                        "outcome": e.outcome,
                        "queue_wait_ms": e.queue_wait_ms,
                        "inference_ms": e.inference_ms,
                        "staleness_ms": e.staleness_ms,
                        "superseded": e.superseded,
                    }
                )
        return sorted(rows, key=lambda row: row["t"])

    async def poll_refusals(self) -> None:
        """Report every request a replica refused since the last poll as a fleet event."""
        asked = time.time()
        for prefix, tail in await self.audit(AuditQuery(errors_only=True, limit=64)):
            replica = prefix.rsplit("/", 1)[-1]
            for e in tail.entries:
                seen = (e.session_id, e.outcome, e.seq_id)
                if seen in self._seen_refusals:
                    continue
                if len(self._seen_refusals) >= _SEEN_REFUSALS:
                    self._seen_refusals.pop(next(iter(self._seen_refusals)))
                self._seen_refusals[seen] = None
                text = f"{replica} answered seq {e.seq_id} with {e.outcome}"
                self.view.event(asked - e.age_ms / 1e3, e.client_id, "refusal", text)
