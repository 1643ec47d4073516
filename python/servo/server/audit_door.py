"""Who may read a replica's recent requests: the audit queryable's admission and its sealed answer.

An `AuditQuery` is answered, cheapest check first, so a stranger costs a decode and a few lookups:

1. **Well formed**: an asker key, a reply key, a signature, a 16-byte nonce.
2. **Fresh**: the nonce is one this replica's status handed out lately (`OpenNonces`): a query
   captured on the link goes stale within a minute.
3. **Somebody this replica knows**, by the server's one admission rule (`servo.access.Access`):
   an operator (``[security] operators``, a fleet file's ``[[monitors]]``) reads the fleet;
   otherwise the asker must be the robot key that made rows under the ``client_id`` it names (it
   reads those rows only: `servo.access.Caller.may_see`). Anybody else is refused in one line,
   before any signature is checked.
4. **A budget per asker key** (`KeyedBuckets`): nobody makes the replica verify and seal without
   end, and nobody spends another's budget.
5. **Signed by that key** (Ed25519, ~80 µs), over the question, this replica's key prefix and
   the nonce (`servo.wire.audit.audit_transcript`).

The answer (an `AuditTail`; operators also get the enrolled robots) is sealed to the query's
ephemeral key and signed by the replica (`servo.wire.sealed`): nobody else reads it, a replayed
query gets an answer only its first asker can read, and a monitor believes only a replica it
trusts.

`AuditDoor.asker` is the admission decision alone.
"""

from __future__ import annotations

from servo._core import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, AuthError, verify_signature
from servo.access import Access, Caller
from servo.identity import Identity
from servo.server.admission import KeyedBuckets
from servo.server.audit import RecentRequests
from servo.server.robots import OpenNonces
from servo.server.trajectories import Signed
from servo.wire import (
    AUDIT_CONTEXT,
    NONCE_SIZE,
    AuditQuery,
    AuditTail,
    Rejection,
    WireError,
    audit_question,
    audit_transcript,
    decode,
    encode,
    fingerprint,
)
from servo.wire.sealed import seal_reply

#: Audit queries answered per second per asker key, and the burst.
QUERIES_PER_S = 5.0
QUERY_BURST = 20


class AuditDoor:
    """Answers the audit queryable. Event loop.

    Args:
        recent: The replica's recent requests.
        nonces: The nonces its status hands out.
        access: The server's admission rule: its operators, and the robots it enrolled (what
            operators are told).
        identity: The replica's identity (signs each answer).
        prefix: The replica's key prefix (bound into what the asker signs).
        replica: The replica's name (bound into what the replica signs).
        rate: Queries answered per second per asker key (and ``burst`` at once).
    """

    def __init__(
        self,
        recent: RecentRequests,
        nonces: OpenNonces,
        access: Access,
        identity: Identity,
        *,
        prefix: str,
        replica: str,
        rate: float = QUERIES_PER_S,
        burst: int = QUERY_BURST,
    ) -> None:
        self._recent, self._nonces, self._access = recent, nonces, access
        self._identity, self._prefix, self._replica = identity, prefix, replica
        self._budget, self._rate = KeyedBuckets(rate, burst), rate

    def asker(self, query: AuditQuery) -> Caller | str:
        """Who may ask ``query`` (checks 1 to 3 of the module, no signature yet), or why nobody."""
        if (
            len(query.asker) != PUBLIC_KEY_SIZE
            or len(query.reply_key) != PUBLIC_KEY_SIZE
            or len(query.signature) != SIGNATURE_SIZE
            or len(query.nonce) != NONCE_SIZE
        ):
            return "an audit query is signed by its asker and sealed to its reply key (upgrade the client)"
        if not self._nonces.fresh(query.nonce):
            return "the query's nonce is not one this replica handed out recently; ask its status again"
        operator = self._access.operator(query.asker)
        if isinstance(operator, Caller):
            return operator
        if query.client_id and query.asker in self._recent.robot_keys(query.client_id):
            return Caller("robot", query.client_id, query.asker)
        return f"{fingerprint(query.asker)} is no operator of this replica, nor the robot whose requests it asks for"

    def answer(self, payload: bytes) -> Signed | Rejection:
        """The sealed answer to an audit query (bounded by the caller), or its one-line refusal."""
        try:
            query = decode(payload, AuditQuery)
        except WireError as exc:
            return Rejection("bad_request", str(exc))
        asker = self.asker(query)
        if isinstance(asker, str):
            return Rejection("unauthenticated", asker)
        if not self._budget.take(query.asker):
            return Rejection("rate_limited", f"more than {self._rate:g} audit queries per second; retry")
        if not verify_signature(query.asker, audit_transcript(query, self._prefix), query.signature):
            return Rejection(
                "unauthenticated", f"the audit query's signature by {fingerprint(query.asker)} does not verify"
            )
        fleet = asker.kind != "robot"
        tail = AuditTail(
            self._replica,
            self._recent.tail(query, robot_key=None if fleet else query.asker),
            robots=dict(self._access.rules.robots) if fleet else {},
        )
        try:
            ciphertext, attachment = seal_reply(
                encode(tail),
                client_key=query.reply_key,
                nonce=query.nonce,
                context=AUDIT_CONTEXT,
                question=audit_question(query, self._replica),
                signer=self._identity,
            )
        except AuthError as exc:
            return Rejection("bad_request", f"reply_key refused: {exc}")
        return Signed(ciphertext, attachment)
