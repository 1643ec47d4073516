"""`PolicyClient`: discover servers and open authenticated sessions.

The building block of the edge runtime, usable on its own from any anyio program. Never imports
torch. Discovery skips replicas whose status does not decode, is inconsistent or names an
untrusted identity; a session open is an X25519 handshake whose ack must carry a valid signature
by the replica's identity (`servo.client.trust`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Literal, Unpack, cast

import anyio
import zenoh

from servo.client.codec import AutoCodec, CodecChooser
from servo.client.discovery import ServerInfo, discover, first_choice
from servo.client.errors import NoServerFound, RequestTimeout, RogueServer, SessionRejected
from servo.client.handshake import handshake
from servo.client.known import KnownServers
from servo.client.options import PLACEMENT_KEYS, ClientOptions, PlacementOptions, SessionOptions
from servo.client.protocol import SessionProtocol
from servo.client.session import RemoteSession
from servo.client.settle import HoldDown, settle
from servo.client.trajectory import fetch_trajectory
from servo.client.trust import TrustedServers
from servo.client.verify import MAX_CHUNK_STEPS, ClientCounters, ClientStatistics
from servo.identity import Identity, robot_identity
from servo.join import JoinToken
from servo.logs import get_logger
from servo.transport import ZenohSettings, open_zsession
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    Features,
    ServerKeys,
    SessionOpen,
    Trajectory,
    segment,
)

log = get_logger(__name__)

#: Refusals another replica (or a later attempt) may not repeat.
RETRYABLE = frozenset({"capacity", "draining", "session_exists", "rate_limited", "stale_nonce"})


class PolicyClient:
    """A robot's handle on the servo network. Owned by the event loop that uses it.

    Args:
        zsession: An open Zenoh session (see `connect` to have one opened and closed for you).
        client_id: This robot's id (a key segment); a random one when omitted.
        jpeg_quality: JPEG quality for camera frames, 0 sends raw pixels, ``"auto"`` picks raw or
            JPEG per request from measured link and codec costs (`servo.client.codec`).
        trusted: The servers to trust (pins); without pins, the ones ``known`` trusts.
        max_chunk_steps: Longest chunk accepted (steps); longer ones are rejected.
        auto_codec: How ``"auto"`` chooses (defaults of `AutoCodec` when omitted).
        downsize: Send each camera at the policy's input size when the server offers it (its
            session ack), shrunk here with the server's own function; False sends frames as given.
        identity: The robot identity that signs session opens; this machine's (``robot.key`` in
            servo's directory, created on first use) when omitted.
        known: Without pins, the servers trusted on first use (`servo.client.known`); the
            user's known-servers file when omitted.
        join: A join token every session open proves, to enrol on first contact (`servo.join`).
    """

    def __init__(
        self,
        zsession: zenoh.Session,
        client_id: str | None = None,
        *,
        jpeg_quality: int | Literal["auto"] = 90,
        trusted: TrustedServers | None = None,
        max_chunk_steps: int = MAX_CHUNK_STEPS,
        auto_codec: AutoCodec | None = None,
        downsize: bool = True,
        identity: Identity | None = None,
        known: KnownServers | None = None,
        join: JoinToken | None = None,
    ) -> None:
        self.zsession = zsession
        self.client_id = segment(client_id or f"robot-{uuid.uuid4().hex[:12]}", what="client_id")
        self.jpeg_quality = jpeg_quality
        self.trusted = trusted or TrustedServers()
        self.max_chunk_steps = max_chunk_steps
        self.auto_codec = auto_codec
        self.downsize = downsize
        self.identity = identity if identity is not None else robot_identity()
        self.known_servers = known if known is not None else KnownServers()
        self.join = join
        self.counters = ClientCounters()
        #: Raw or JPEG per request, for every session: the link is the robot's, so a failover goes on
        #: from what was measured, not from raw frames again (on a slow link, seconds per request).
        self.codec = CodecChooser(jpeg_quality, auto_codec)
        #: The replicas of the last discovery (what `connect_best` fails over to first).
        self._known: list[ServerInfo] = []
        #: When this robot may move between replicas again (`servo.client.settle`).
        self._hold = HoldDown()

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, settings: ZenohSettings, client_id: str | None = None, **options: Unpack[ClientOptions]
    ) -> AsyncIterator[PolicyClient]:
        """Open a Zenoh session for the client and close it on exit.

        Args:
            settings: How to reach the servo network.
            client_id: This robot's id (a key segment); a random one when omitted.
            **options: The constructor's keywords (`ClientOptions`); the robot identity, when
                not given, is read (or created) off the event loop.

        Raises:
            IdentityError: this machine's robot identity cannot be read or created.
            zenoh.ZError: the Zenoh session could not be opened (no reachable router).
        """
        if options.get("identity") is None:
            options["identity"] = await anyio.to_thread.run_sync(robot_identity)
        async with open_zsession(settings) as zsession:
            yield cls(zsession, client_id, **options)

    def statistics(self) -> ClientStatistics:
        """What this client refused so far (rejected chunks by reason, rogue replicas, …)."""
        return self.counters.snapshot()

    async def discover(
        self, *, app: str | None = None, model: str | None = None, timeout: float = 2.0
    ) -> list[ServerInfo]:
        """Ask every replica for its status; returns the usable ones, least-loaded first.

        A reply that does not decode (or advertises an impossible load) is skipped with a
        rate-limited warning; one that names another replica than its key, or an identity this
        client does not trust, is skipped and counted as rogue. Neither is ever fatal.

        Without pins, only identities trusted for the deployment are used (`servo.client.known`).

        Raises:
            UntrustedServer: replicas answered, none with an identity trusted for the deployment.
            NoServerFound: nobody usable answered.
        """
        servers = await discover(
            self.zsession, self.trusted, self.counters, app=app, model=model, timeout=timeout, known=self.known_servers
        )
        self._known = servers
        return servers

    async def open_session(
        self,
        server: ServerInfo,
        *,
        features: Features,
        fps: float,
        task: str = "",
        rtc: bool = False,
        epoch: int = 0,
        tags: dict[str, str] | None = None,
        timeout: float = 2.0,
        previous: RemoteSession | None = None,
    ) -> RemoteSession:
        """Open (and validate) a session on ``server``: the handshake.

        Args:
            server: The replica, as discovered.
            features: The robot's feature contract.
            fps: The robot's control rate.
            task: Task instruction (the server's default when empty).
            rtc: Ask for real-time chunking.
            epoch: Session epoch (bumped by the caller at every reconnect).
            tags: Free-form labels (bounded: see `servo.wire.messages`).
            timeout: How long to wait for the ack.
            previous: This client's previous session on the same replica, if any: the open
                proves it held it, so the server lets the new session replace it even when the
                old one's close was lost.

        The open is signed by this client's robot identity (`servo.client.handshake`).

        Raises:
            SessionRejected: the server refused; ``.rejection.code`` names the failed rule.
            RogueServer: only forged or unverifiable acks came back (counted, never used).
            RequestTimeout: the server did not answer.
        """
        protocol = SessionProtocol(
            epoch=epoch,
            action_dim=len(features.action_names),
            counters=self.counters,
            max_chunk_steps=self.max_chunk_steps,
            downsize=self.downsize,
            action_key=server.keys.client(self.client_id).action,
            server_identity=server.status.identity,
        )
        keys = server.keys.client(self.client_id)
        session = RemoteSession(self.zsession, server, keys, protocol, codec=self.codec)
        session.declare()
        try:
            request = SessionOpen(
                self.client_id,
                list(SUPPORTED_SCHEMA_VERSIONS),
                features,
                fps,
                bytes(32),  # the handshake's own X25519 key goes here
                task=task,
                rtc=rtc,
                session_epoch=epoch,
                tags=dict(tags or {}),
            )
            ack = await handshake(
                self.zsession,
                session,
                request,
                identity=self.identity,
                counters=self.counters,
                previous=previous,
                timeout=timeout,
                join=self.join,
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.close()
            raise
        log.info(
            "session opened",
            session_id=session.session_id,
            client_id=self.client_id,
            replica=server.keys.replica,
            rtc=ack.rtc,
            warnings=ack.warnings,
        )
        return session

    async def fetch_trajectory(self, server: ServerInfo, name: str, *, timeout: float = 5.0) -> Trajectory:
        """Fetch a whole named trajectory from a server's library in one request signed by this robot.

        Only the replica's own answer to this request is believed (`servo.client.trajectory`).

        Raises:
            ServerError: no such trajectory (the message lists what it has), or not admitted.
            RogueServer: only answers that failed verification came back (counted).
            RequestTimeout: no answer in time.
        """
        return await fetch_trajectory(self.zsession, server, name, robot=self, counters=self.counters, timeout=timeout)

    @asynccontextmanager
    async def session(
        self, server: ServerInfo | None = None, *, features: Features, fps: float, **options: Unpack[PlacementOptions]
    ) -> AsyncIterator[RemoteSession]:
        """A session for the block: ``async with client.session(features=…, fps=…) as session``.

        Opened on ``server`` (`open_session`) or, without one, on the best replica (`connect_best`,
        steered by ``app``, ``model``, ``accept``, ``settle``, ``avoid``); closed when the block
        ends, whatever ends it. The other ``options`` are `open_session`'s.

        Raises:
            TypeError: ``server`` given with a keyword that chooses the replica.
            NoServerFound, UntrustedServer, SessionRejected, RogueServer, RequestTimeout: as
                `connect_best` and `open_session` raise them.
        """
        if server is None:
            opened = await self.connect_best(features=features, fps=fps, **options)
        elif choosing := sorted(PLACEMENT_KEYS & options.keys()):
            raise TypeError(f"session(): {', '.join(choosing)} choose the replica, which server= names: pass one")
        else:
            opened = await self.open_session(server, features=features, fps=fps, **cast(SessionOptions, options))
        try:
            yield opened
        finally:
            with anyio.CancelScope(shield=True):
                await opened.close()

    async def connect_best(
        self,
        *,
        features: Features,
        fps: float,
        app: str | None = None,
        model: str | None = None,
        accept: Callable[[ServerInfo], bool] | None = None,
        settle: bool = True,
        avoid: Collection[ServerKeys] = (),
        **options: Unpack[SessionOptions],
    ) -> RemoteSession:
        """Discover, then open a session on a lightly loaded replica that accepts us.

        The first choice is drawn among the replicas of about the best `placement_score`
        (`first_choice`): robots placing themselves on one view of the fleet (a failover) spread;
        the rest follow by score. With ``settle``, the client then looks at the fleet again and
        moves while its replica holds two or more sessions more than the emptiest, as many robots
        as the imbalance needs and never back within a second (`servo.client.settle`). With
        ``avoid`` (replicas known gone), the others of the last discovery are tried first, without
        a status query to each: a failover herd would send one; that view is old, so the first is
        drawn among all of them (`first_choice`).

        A replica that is full, draining, still holds our previous session (``session_exists``)
        or whose ack fails verification is skipped; any other rejection is final (the next
        replica of the same model would refuse for the same reason).
        """
        usable = accept or (lambda _: True)
        known = [s for s in self._known if s.keys not in avoid and usable(s)]
        if avoid and known:
            with contextlib.suppress(SessionRejected, RogueServer, RequestTimeout):
                return await self._place(
                    first_choice(known, recent=False), app, model, usable, settle, features, fps, **options
                )
        servers = [s for s in await self.discover(app=app, model=model) if usable(s)]
        if not servers:
            raise NoServerFound("no discovered server matches the requested model")
        return await self._place(first_choice(servers), app, model, usable, settle, features, fps, **options)

    async def _place(
        self,
        servers: list[ServerInfo],
        app: str | None,
        model: str | None,
        usable: Callable[[ServerInfo], bool],
        settle: bool,
        features: Features,
        fps: float,
        **options: Unpack[SessionOptions],
    ) -> RemoteSession:
        """Open on the first of ``servers`` (in the order to try them) that takes the session."""
        last: SessionRejected | RogueServer | None = None
        for server in servers:
            try:
                session = await self.open_session(server, features=features, fps=fps, **options)
            except SessionRejected as exc:
                if exc.rejection.code not in RETRYABLE:
                    raise
                last = exc
                continue
            except RogueServer as exc:
                last = exc
                continue
            if settle:
                options.pop("previous", None)  # it proves a session on the first replica only
                session = await self._settle(session, app, model, usable, features, fps, **options)
            return session
        assert last is not None
        raise last

    async def rebalance(
        self,
        session: RemoteSession,
        *,
        features: Features,
        fps: float,
        app: str | None = None,
        model: str | None = None,
        accept: Callable[[ServerInfo], bool] | None = None,
        **options: Unpack[SessionOptions],
    ) -> RemoteSession | None:
        """The settling of `connect_best`, for a session that already streams (a replica appeared).

        Looks at the fleet the same way and, the first time the rule says to move, opens a
        session on the emptiest replica and returns it; the caller switches to it and closes
        ``session``. None when it stays. ``options`` are `open_session`'s (``epoch`` included).
        """
        usable = accept or (lambda _: True)
        moved = await self._settle(session, app, model, usable, features, fps, True, **options)
        return None if moved is session else moved

    async def _settle(
        self,
        session: RemoteSession,
        app: str | None,
        model: str | None,
        usable: Callable[[ServerInfo], bool],
        features: Features,
        fps: float,
        first_move: bool = False,
        **options: Unpack[SessionOptions],
    ) -> RemoteSession:
        """Settle ``session``'s robot on the fleet (`servo.client.settle`); the session it ends on.

        With ``first_move``, the first new session is returned at once and the old one left open.
        """
        current = session

        async def look() -> list[ServerInfo] | None:
            try:
                # The default timeout: a replica slow to answer under load is still in the view.
                return [s for s in await self.discover(app=app, model=model) if usable(s)]
            except NoServerFound:
                return None

        async def move(target: ServerInfo) -> ServerKeys | None:
            nonlocal current
            try:
                moved = await self.open_session(target, features=features, fps=fps, **options)
            except (SessionRejected, RogueServer, RequestTimeout):
                return None
            if not first_move:
                await current.close()
            current = moved
            return moved.server.keys

        await settle(session.server.keys, look, move, self._hold, once=first_move)
        return current
