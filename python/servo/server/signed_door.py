"""A replica's signed doors: queryables whose every answer costs it an Ed25519 signature.

The status (`StatusDoor`: discovery and the handshake read it), the audit trail
(`servo.server.audit_door`) and the trajectory library (`servo.server.trajectories`) answer
anybody on the network with a reply the replica signs, so each is bounded before it does any
work a stranger could ask for without end (`DoorBudget`):

1. **The door's budget**, all requesters together (``[limits] door_requests_per_s`` and
   ``door_request_burst``; ``status_queries_per_s`` and ``status_query_burst`` for the status):
   checked on Zenoh's callback thread, before the query reaches the event loop or a byte of it
   is decoded. Beyond it the query is dropped unanswered: silence, nothing signed. This is the
   bound a key-minting attacker meets: a fresh key gets a fresh bucket of its own, not a fresh
   door.
2. **The requester's budget** (``requester_requests_per_s``, ``requester_request_burst``), per
   key the request names, once it decoded and before anything is looked up or verified; beyond
   it, silence too.

A request within both is answered by `SignedDoor.answer`, cheapest check first: well formed;
admitted by the server's one admission rule (`servo.access`; a door's refusal here is one line,
signed only where the client needs to verify it); signed by the requester's key (~80 µs);
answered (sealed to the request's ephemeral key and signed: `servo.wire.sealed`). Revocation
is at once: admission asks the rule now in force (`servo.access.Access`), not the past.

Session opens (`servo.server.robots`) get a door budget too (``door_requests_per_s``): each
may cost a signature check (and an ack's signature), so they are bounded before they are read.

Every signature a door makes is counted (``servo_door_signatures_total{door}``), and every
query it drops (``servo_door_dropped_total{door, budget}``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import msgspec
from prometheus_client import Counter

from servo._core import verify_signature
from servo.access import Caller
from servo.server.admission import KeyedBuckets, TokenBucket
from servo.server.manifest import LimitsSection
from servo.server.metrics import ServerMetrics
from servo.wire import Rejection, StatusReply, WireError, decode, encode, status_transcript
from servo.wire.sealed import Signer

Request = TypeVar("Request", bound=msgspec.Struct)

#: Largest nonce a status query may carry (its payload).
MAX_STATUS_NONCE = 32


@dataclass(frozen=True)
class Signed:
    """A reply body and the attachment that proves it (the replica's signature and what it covers). Frozen."""

    body: bytes
    attachment: bytes


class CountedSigner:
    """The replica's identity, counting what it signs for one door. Any thread.

    Args:
        identity: Signs.
        signed: Counts each signature.
    """

    def __init__(self, identity: Signer, signed: Counter) -> None:
        self._identity, self._signed = identity, signed

    def sign(self, message: bytes) -> bytes:
        """``identity``'s signature of ``message``, counted."""
        self._signed.inc()
        return self._identity.sign(message)


class DoorBudget:
    """A door's budgets (module docstring): `knock` on any thread, `take` on the event loop.

    Args:
        door: Its name in the metrics (``status``, ``audit``, ``trajectory``).
        metrics: Where dropped queries are counted.
        rate: Queries let in per second, all requesters together, and ``burst`` at once.
        per_key: The same per requester key; None: the door knows no requester (the status).
        clock: Time (tests drive it).
    """

    def __init__(
        self,
        door: str,
        metrics: ServerMetrics,
        *,
        rate: float,
        burst: int,
        per_key: tuple[float, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._door = TokenBucket(rate, burst, clock)
        self._keys = None if per_key is None else KeyedBuckets(*per_key, clock=clock)
        self._door_full = metrics.door_dropped.labels(door, "door")
        self._key_full = metrics.door_dropped.labels(door, "requester")

    @classmethod
    def signed_door(cls, door: str, metrics: ServerMetrics, limits: LimitsSection) -> DoorBudget:
        """The budgets ``[limits]`` gives the audit or the trajectory door."""
        per_key = (limits.requester_requests_per_s, limits.requester_request_burst)
        return cls(door, metrics, rate=limits.door_requests_per_s, burst=limits.door_request_burst, per_key=per_key)

    def knock(self) -> bool:
        """Whether one more query may come in at all (thread-safe; before it is decoded)."""
        if self._door.take():
            return True
        self._door_full.inc()
        return False

    def take(self, key: Hashable) -> bool:
        """Whether ``key`` may ask once more (event loop; before anything is verified)."""
        if self._keys is None or self._keys.take(key):
            return True
        self._key_full.inc()
        return False


class SignedDoor(ABC, Generic[Request]):
    """A door answering signed requests with signed replies (module docstring). Event loop.

    A door says what it reads (``request_type``) and implements its checks and its answer.

    Args:
        identity: The replica's identity (signs each answer, and the refusals the door signs).
        metrics: Where its signatures and dropped queries are counted.
        limits: ``[limits]``: the door's budgets (``budget``: the queryable's callback calls its
            `DoorBudget.knock`).
        prefix: The replica's key prefix (bound into what the requester signs).
        replica: The replica's name (bound into what the replica signs).
    """

    request_type: ClassVar[type[msgspec.Struct]]
    door: ClassVar[str]

    def __init__(
        self, identity: Signer, metrics: ServerMetrics, limits: LimitsSection, *, prefix: str, replica: str
    ) -> None:
        self.budget = DoorBudget.signed_door(self.door, metrics, limits)
        self.signer = CountedSigner(identity, metrics.door_signatures.labels(self.door))
        self.prefix, self.replica = prefix, replica

    def answer(self, payload: bytes) -> Signed | Rejection | None:
        """The answer to a request (bounded by the caller), its refusal, or None: beyond budget, silence."""
        try:
            request: Request = decode(payload, self.request_type)  # type: ignore[assignment]
        except WireError as exc:
            return Rejection("bad_request", str(exc))
        malformed = self.malformed(request)
        if malformed is not None:
            return Rejection("unauthenticated", malformed)  # no client of this version sent it: unsigned
        key, transcript, signature = self.signed(request)
        if not self.budget.take(key):
            return None
        caller = self.admit(request)
        if isinstance(caller, Rejection):
            return self.refuse(request, caller)
        if not verify_signature(key, transcript, signature):
            return self.refuse(request, Rejection("unauthenticated", self.forged(request)))
        return self.respond(request, caller)

    @abstractmethod
    def malformed(self, request: Request) -> str | None:
        """Why ``request`` cannot be from a client of this version (sizes of its keys and nonce), if so."""

    @abstractmethod
    def signed(self, request: Request) -> tuple[bytes, bytes, bytes]:
        """The requester's key (its budget's key), what it signed, and its signature."""

    @abstractmethod
    def admit(self, request: Request) -> Caller | Rejection:
        """Who asks, by the admission rule now in force (cheap lookups only), or the refusal."""

    @abstractmethod
    def forged(self, request: Request) -> str:
        """The refusal's reason when ``request``'s signature does not verify."""

    @abstractmethod
    def respond(self, request: Request, caller: Caller) -> Signed | Rejection:
        """The answer to an admitted, verified request, sealed and signed by `signer`."""

    def refuse(self, request: Request, rejection: Rejection) -> Rejection:
        """The refusal sent for ``request`` (unsigned; a door whose client verifies refusals signs it)."""
        return rejection


class StatusDoor:
    """Answers the status queryable: the replica's status, signed over the asker's nonce. Event loop.

    It names no requester, so it has a door budget only (``status_queries_per_s``): enough for a
    fleet's discovery and failover (each robot asks a few times when it places itself), not
    for a stranger asking in a loop.

    Args:
        status: The status to send now, given the nonce the next session open must carry.
        nonce: That nonce now (`servo.server.robots.OpenNonces.current`).
        identity: The replica's identity.
        metrics: Where its signatures and dropped queries are counted.
        limits: ``[limits]``: the door's budget.
    """

    door = "status"

    def __init__(
        self,
        status: Callable[[bytes], StatusReply],
        nonce: Callable[[], bytes],
        identity: Signer,
        metrics: ServerMetrics,
        limits: LimitsSection,
    ) -> None:
        self._status, self._nonce = status, nonce
        self.budget = DoorBudget(self.door, metrics, rate=limits.status_queries_per_s, burst=limits.status_query_burst)
        self.signer = CountedSigner(identity, metrics.door_signatures.labels(self.door))

    def answer(self, payload: bytes) -> Signed | Rejection:
        """The signed status for the asker's nonce ``payload`` (checked by the caller to fit `MAX_STATUS_NONCE`)."""
        body = encode(self._status(self._nonce()))
        return Signed(body, self.signer.sign(status_transcript(payload, body)))
