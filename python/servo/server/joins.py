"""Join tokens on the server: who may still join, enrolling those who do, in step with the roster.

`JoinDesk` keeps the roster's tokens and enrolments in memory for the session-open handler
(`servo.server.robots.RobotGate` asks it about an open that carries a join proof) and feeds the
enrolled robots and API keys to the admission rule (`servo.access.Access`). Its `watch` task
keeps memory and file in step, off the event loop:

* an enrolment made by a join is in force at once (in memory: the token's use is spent there,
  so two robots racing for a single-use token cannot both win on this replica) and written to
  the roster right after, under its lock. If the file says otherwise by then (the token was
  revoked, or another replica sharing the roster spent its last use), the enrolment is undone
  and the robot's session closed;
* the file is read again whenever its ``stat`` changes (checked every `POLL_S`), so
  ``servo-serve robots revoke …`` and new tokens take effect on a running server within about
  a second: a revoked robot's sessions are closed (``revoked``), and it cannot open another.

The pure edits of the file (`issue`, `spend`, `revoke_robot`, `revoke_token`) are shared with
``servo-serve robots`` (`servo.cli.robots`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import msgspec

from servo.access import Access, ApiKey, Denied
from servo.join import JoinToken, verify_join
from servo.logs import get_logger
from servo.server.roster import Advertised, Roster, RosterError, RosterFile, RosterRobot, RosterToken
from servo.wire import SessionOpen, WireError, fingerprint, parse_fingerprint

if TYPE_CHECKING:
    from servo.server.state import ServerState

log = get_logger(__name__)

#: How often a running server looks at the roster file for changes (s).
POLL_S = 1.0


@dataclass(frozen=True)
class _Spend:
    token: str
    name: str
    key: bytes


def issue(
    file: RosterFile, token: JoinToken, *, ttl_s: float, uses: int, name: str = "", now: float
) -> tuple[RosterFile, JoinToken]:
    """``file`` with ``token`` kept as a verifier (`servo.join`), valid ``ttl_s`` for ``uses`` robots."""
    kept = RosterToken(token.id, fingerprint(token.verifier), expires=now + ttl_s, uses=uses, name=name, created=now)
    return msgspec.structs.replace(file, tokens=[*file.tokens, kept]), token


def spend(file: RosterFile, token_id: str, name: str, key: bytes, now: float) -> tuple[RosterFile, str | None]:
    """``file`` with one use of ``token_id`` spent on robot ``name`` (``key``); or why it could not be."""
    token = file.token(token_id)
    if token is None:
        return file, f"join token {token_id} is not known to this server"
    problem = token.problem(now)
    if problem is None and file.robot(name) is not None:
        problem = f"robot {name!r} is enrolled already"
    if problem is not None:
        return file, problem
    used = msgspec.structs.replace(token, uses=token.uses - 1, used_by=[*token.used_by, name])
    tokens = [used if t.id == token_id else t for t in file.tokens]
    robots = [*file.robots, RosterRobot(name, fingerprint(key), token=token_id, joined=now)]
    return msgspec.structs.replace(file, tokens=tokens, robots=robots), None


def revoke_robot(file: RosterFile, name: str) -> tuple[RosterFile, bool]:
    """``file`` without robot ``name``; whether it was there."""
    robots = [r for r in file.robots if r.name != name]
    return msgspec.structs.replace(file, robots=robots), len(robots) != len(file.robots)


def revoke_token(file: RosterFile, token_id: str) -> tuple[RosterFile, bool]:
    """``file`` with token ``token_id`` revoked; whether it was there."""
    token = file.token(token_id)
    if token is None:
        return file, False
    tokens = [msgspec.structs.replace(t, revoked=True) if t.id == token_id else t for t in file.tokens]
    return msgspec.structs.replace(file, tokens=tokens), True


def advertise(file: RosterFile, advertised: Advertised) -> tuple[RosterFile, None]:
    """``file`` remembering what the server now starting advertises (for ``servo-serve robots token``)."""
    return msgspec.structs.replace(file, server=advertised), None


class JoinDesk:
    """The roster in memory, for admission (module docstring). Owned by the event loop.

    What it holds, and where each part comes from::

        roster file ──read by `watch` (off the loop)──► _base (+ _parsed, _keys) ──┐
                                                                                    ├─► _view, _holders,
        a proven join ──`enrol`──► _pending ─────────────────────────────────────────┘   access.robots
                                      └── written by `watch` under the roster lock; dropped once read back

    Args:
        roster: The roster file; None keeps everything in memory (tests, embedding).
        access: The admission rule whose enrolled robots and API keys this desk maintains.
        static: Robots enrolled by the manifest and the fleet file: they win a conflict with the
            roster, and cannot be revoked from it.
    """

    def __init__(self, roster: Roster | None, access: Access, static: Mapping[str, bytes]) -> None:
        self.roster = roster
        self._access = access
        self._static = dict(static)
        #: The file as last read, and the joins made since that are not in it yet.
        self._base = RosterFile()
        self._parsed: dict[str, bytes] = dict(static)
        self._keys: dict[str, ApiKey] = {}
        self._holders: dict[bytes, str] = {}
        self._pending: list[_Spend] = []
        self._view = self._base
        self._wake = anyio.Event()
        self._stamp: tuple[int, int, int] | None = None

    def apply(self, file: RosterFile) -> None:
        """Adopt ``file`` as the roster as read (joins made here but not yet written stay in force)."""
        self._base = file
        self._parsed = dict(self._static)
        for robot in file.robots:
            try:
                key = parse_fingerprint(robot.identity)
            except WireError:
                log.warning("roster entry skipped: malformed identity", name=robot.name)
                continue
            if self._parsed.setdefault(robot.name, key) != key:
                log.warning("roster entry skipped: the manifest enrols this name", name=robot.name)
        self._keys = {k.id: ApiKey(k.name, bytes.fromhex(k.digest), k.expires) for k in file.api_keys}
        self._refresh()

    def _refresh(self) -> None:
        """The view the open handler checks: the file as read, and the joins not written yet."""
        view, robots = self._base, dict(self._parsed)
        for spent in self._pending:  # a second's worth at most: `watch` writes them
            view, _ = spend(view, spent.token, spent.name, spent.key, time.time())
            robots.setdefault(spent.name, spent.key)
        self._view = view
        self._holders = {key: name for name, key in robots.items()}
        self._access.update(robots=robots, api_keys=self._keys)

    def refusal(self, request: SessionOpen, now: float) -> str | None:
        """Why ``request``'s join token cannot enrol it (cheap checks only); None: go on."""
        token = self._view.token(request.join_id)
        if token is None:
            return f"join token {request.join_id} is not known to this server (ask its operator for a new one)"
        problem = token.problem(now)
        if problem is not None:
            return f"{problem} (ask the server's operator for a new one: servo-serve robots token)"
        if token.name and token.name != request.client_id:
            return f"join token {token.id} is for robot {token.name!r}, not {request.client_id!r}"
        holder = self._holders.get(request.robot_key)
        if holder is not None:
            return f"identity {fingerprint(request.robot_key)} is enrolled as {holder!r} (one identity, one robot name)"
        return None

    def proves(self, request: SessionOpen, prefix: str) -> bool:
        """Whether ``request``'s join signature proves its token (after `refusal` said None)."""
        token = self._view.token(request.join_id)
        return token is not None and verify_join(request, prefix, parse_fingerprint(token.verifier))

    def enrol(self, request: SessionOpen) -> None:
        """Enrol ``request``'s robot by its proven token: in force now, written by `watch` soon."""
        spent = _Spend(request.join_id, request.client_id, request.robot_key)
        if self.roster is None:  # kept in memory only: nothing to write
            self._base, _ = spend(self._base, spent.token, spent.name, spent.key, time.time())
            self._parsed.setdefault(spent.name, spent.key)
        else:
            self._pending.append(spent)
        self._refresh()
        log.info("robot joined", client_id=spent.name, identity=fingerprint(spent.key), token=spent.token)
        self._wake.set()

    def read(self) -> None:
        """Read the roster file now (off the event loop: at start). A missing file is empty.

        Raises:
            RosterError: the file cannot be used.
        """
        if self.roster is not None:
            self._stamp = self.roster.stamp()
            self.apply(self.roster.read())

    async def watch(self, state: ServerState) -> None:
        """Keep memory and the roster file in step until cancelled (module docstring)."""
        if self.roster is None:
            return
        while True:
            with anyio.move_on_after(POLL_S):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                changed = await self._sync()
            except RosterError as exc:
                log.error("roster unusable: enrolments unchanged", error=str(exc))
                continue
            if changed:
                self._close_unadmitted(state)

    async def _sync(self) -> bool:
        """Write the joins made, read the file if it changed; whether anything may have changed."""
        roster = self.roster
        assert roster is not None
        written = list(self._pending)
        for spent in written:
            problem = await anyio.to_thread.run_sync(
                roster.change, lambda f, s=spent: spend(f, s.token, s.name, s.key, time.time())
            )
            if problem is not None:
                log.warning("join undone", client_id=spent.name, reason=problem)
        stamp = await anyio.to_thread.run_sync(roster.stamp)
        if stamp == self._stamp and not written:
            return False
        base = await anyio.to_thread.run_sync(roster.read)
        self._pending = [p for p in self._pending if p not in written]
        self._stamp = stamp
        self.apply(base)
        return True

    def _close_unadmitted(self, state: ServerState) -> None:
        """Close the sessions of robots the rules no longer admit (revoked, or a join undone)."""
        for session in state.registry.snapshot():
            if isinstance(self._access.robot(session.client_id, session.auth.robot_key), Denied):
                log.info("robot no longer admitted", client_id=session.client_id)
                state.collect(session, "revoked")
