"""Which robots may open a session, and how many opens each may ask for.

Every session open is signed by the robot's Ed25519 identity (`servo.wire.trust.open_transcript`).
`RobotGate.admit` decides, cheapest check first, before the open costs a slot or any shared budget
(the control plane let it in within the session door's budget for everybody, before reading it:
`servo.server.signed_door.DoorBudget`):

1. **Signed at all**: an open without a robot key and signature (a client older than robot
   identities) is refused (``unauthenticated``).
2. **Admitted** by the server's one admission rule (`servo.access.Access.robot`): an enrolled
   name only with the key enrolled for it, so nobody takes a robot's name; a robot nobody
   enrolled only when the door is open (a loopback-only server that enrols nobody, or
   ``--allow-any-robot``); strangers are refused before they spend anything. The server's own
   identity (its frontends open sessions with it) is always admitted. A robot refused here may
   carry a join token's proof (`servo.join`): the token must be usable for it
   (`servo.server.joins.JoinDesk.refusal`: known, not spent, expired or revoked, for this name),
   and after the checks below its proof must verify; then it is enrolled, at once.
3. **Fresh** (`OpenNonces`): the nonce must be one the replica's status handed out in the last
   `NONCE_PERIOD_S` to twice that (``stale_nonce``: discover again), and the open's X25519 key
   must be new, so a captured open cannot be replayed to replace the robot's session.
4. **Signed by that key** (Ed25519 verification, ~80 µs): only now is the open worth a budget.
5. **Budgets**: per robot (key and name: several robots of one machine may share its key;
   ``client_opens_per_s``), then for everyone: enrolled robots share one bucket
   (``session_opens_per_s``); without enrolment, keys that already streamed on this replica
   (`servo.server.admission.ReturningRobots`) and never-seen keys have a bucket each, so a flood of fresh identities
   cannot lock a returning robot out. Nobody can spend another robot's budget: it is keyed by
   a key only its holder signs with. Joins spend the new robots' bucket.

What passes is the caller (`servo.access.Caller`): whether the replica enrolled it decides how
its session's audit rows are kept (`servo.server.audit.RecentRequests`).

A full replica makes room for a returning robot too (`RobotGate.displaceable`): on an open door,
a session that has not streamed one authenticated observation since it opened (more than
`DISPLACE_AFTER_S` ago) yields its slot, so opens that only hold slots cannot lock out a robot
that used this replica. On a closed door strangers hold no slot in the first place.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servo._core import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, verify_signature
from servo.access import Access, Caller, Denied
from servo.server.admission import KeyedBuckets, ReturningRobots, TokenBucket
from servo.server.manifest import LimitsSection
from servo.wire import NONCE_SIZE, SessionOpen, fingerprint, open_transcript
from servo.wire.messages import RejectCode

if TYPE_CHECKING:
    from servo.server.joins import JoinDesk
    from servo.server.sessions import Session

#: A status nonce stays valid for one to two periods (s).
NONCE_PERIOD_S = 30.0
#: Most X25519 keys of recent opens remembered (the oldest are forgotten first).
MAX_RECENT_OPENS = 65536
#: A session that never streamed yields its slot to a returning robot once this old (s).
DISPLACE_AFTER_S = 1.0


@dataclass(frozen=True)
class Refusal:
    """Why the gate refused an open: a `servo.wire.Rejection` code and its reason."""

    code: RejectCode
    reason: str


class OpenNonces:
    """The nonces a replica hands out, and the X25519 keys of the opens it accepted with them.

    Event loop (status and session-open handlers). The nonce changes every `NONCE_PERIOD_S`; the
    current and the previous one are accepted, and each open's X25519 key only once while its
    nonce is valid (the keys seen are kept for two periods, at most `MAX_RECENT_OPENS`).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since = clock()
        self._current, self._previous = secrets.token_bytes(NONCE_SIZE), b""
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def current(self) -> bytes:
        """The nonce a status reply hands out now."""
        self._rotate()
        return self._current

    def fresh(self, nonce: bytes) -> bool:
        """Whether ``nonce`` was handed out by this replica recently."""
        self._rotate()
        return len(nonce) == NONCE_SIZE and nonce in (self._current, self._previous)

    def seen(self, client_key: bytes) -> bool:
        """Whether an open with this X25519 key was accepted while its nonce could still be valid."""
        return client_key in self._seen

    def use(self, client_key: bytes) -> None:
        """Remember an accepted open's X25519 key: a replay of the open is refused."""
        self._seen[client_key] = self._clock()
        while len(self._seen) > MAX_RECENT_OPENS:
            self._seen.popitem(last=False)

    def _rotate(self) -> None:
        now = self._clock()
        if now - self._since < NONCE_PERIOD_S:
            return
        # After two periods without a status query the previous nonce is as stale as the current.
        self._previous = self._current if now - self._since < 2 * NONCE_PERIOD_S else b""
        self._current, self._since = secrets.token_bytes(NONCE_SIZE), now
        horizon = now - 2 * NONCE_PERIOD_S
        while self._seen and next(iter(self._seen.values())) < horizon:
            self._seen.popitem(last=False)


class RobotGate:
    """Admits or refuses session opens by their robot signature, admission and budgets. Event loop.

    Args:
        access: The server's admission rule (who is enrolled, whether the door is open).
        joins: The join tokens (`servo.server.joins`).
        limits: The open budgets.
        returning: Keys that streamed here (shared with the observation path).
    """

    def __init__(self, access: Access, joins: JoinDesk, limits: LimitsSection, returning: ReturningRobots) -> None:
        self.access = access
        self.joins = joins
        self.nonces = OpenNonces()
        self._returning = returning
        self._limits = limits
        self._per_key = KeyedBuckets(limits.client_opens_per_s, limits.client_open_burst)
        self._known = TokenBucket(limits.session_opens_per_s, limits.session_open_burst)
        self._strangers = TokenBucket(limits.session_opens_per_s, limits.session_open_burst)

    @property
    def enrolled(self) -> dict[str, bytes]:
        """The robots enrolled now, name to key."""
        return dict(self.access.rules.robots)

    def admit(self, request: SessionOpen, prefix: str) -> Caller | Refusal:
        """Who opens ``request``, when it may go on to validation and capacity; else why not (see the module).

        A robot that joined with this open is returned enrolled (it is, from now on).
        """
        key = request.robot_key
        if len(key) != PUBLIC_KEY_SIZE or len(request.robot_signature) != SIGNATURE_SIZE:
            return Refusal(
                "unauthenticated",
                "the session open is not signed by a robot identity (servo clients sign it since wire "
                "schema 2 with robot identities: upgrade the client)",
            )
        caller = self.access.robot(request.client_id, key)
        joining = isinstance(caller, Denied)
        if isinstance(caller, Denied):
            why = self.joins.refusal(request, time.time()) if request.join_id else caller.reason
            if why is not None:
                return Refusal("unauthenticated", why)
        if not self.nonces.fresh(request.nonce):
            return Refusal(
                "stale_nonce", "the open's nonce is not one this replica handed out recently; discover again"
            )
        if self.nonces.seen(request.client_key):
            return Refusal("unauthenticated", "this session open was accepted already (a replay)")
        if not verify_signature(key, open_transcript(request, prefix), request.robot_signature):
            return Refusal("unauthenticated", f"the open's signature by {fingerprint(key)} does not verify")
        if joining and not self.joins.proves(request, prefix):
            return Refusal("unauthenticated", f"the proof of join token {request.join_id} does not verify")
        self.nonces.use(request.client_key)
        refusal = self._budget(key, request.client_id, known=isinstance(caller, Caller) and caller.enrolled)
        if refusal is not None:
            return refusal
        if isinstance(caller, Denied):
            self.joins.enrol(request)
            return Caller("robot", request.client_id, key)
        return caller

    def displaceable(self, key: bytes, sessions: Iterable[Session]) -> Session | None:
        """The session a full replica closes to let robot ``key`` in, if any (see the module).

        Only for a returning robot on an open door: the oldest session that never streamed and
        is older than `DISPLACE_AFTER_S` (none of the replica's own frontends).
        """
        rules = self.access.rules
        if not rules.any_robot or key not in self._returning:
            return None
        cutoff = time.monotonic_ns() - int(DISPLACE_AFTER_S * 1e9)
        idle = [
            s
            for s in sessions
            if not s.streamed and s.auth.robot_key != rules.server and s.auth.last_observation_ns < cutoff
        ]
        return min(idle, key=lambda s: s.auth.last_observation_ns, default=None)

    def _budget(self, key: bytes, name: str, *, known: bool) -> Refusal | None:
        limits, own = self._limits, key == self.access.rules.server
        if not own and not self._per_key.take((key, name)):
            return Refusal(
                "rate_limited",
                f"more than {limits.client_opens_per_s:g} session opens per second by {name!r} "
                f"({fingerprint(key)}); retry",
            )
        known = known or own or key in self._returning
        if not (self._known if known else self._strangers).take():
            who = "" if known else " by robots new to this server"
            return Refusal(
                "rate_limited", f"more than {limits.session_opens_per_s:g} session opens per second{who}; retry"
            )
        return None
