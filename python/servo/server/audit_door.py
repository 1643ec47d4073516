"""Who may read a replica's recent requests: the audit queryable, a signed door (`servo.server.signed_door`).

An `AuditQuery` within the door's budgets (all askers together, then per asker key) is answered,
cheapest check first:

1. **Well formed**: an asker key, a reply key, a signature, a 16-byte nonce.
2. **Fresh**: the nonce is one this replica's status handed out lately (`OpenNonces`): a query
   captured on the link goes stale within a minute.
3. **Somebody this replica admits now**, by the server's one admission rule (`servo.access.Access`):
   an operator (``[security] operators``, a fleet file's ``[[monitors]]``) reads the fleet; a
   robot the rule admits under the ``client_id`` it names, with the key that made that client's
   rows, reads those rows only (`servo.access.Caller.may_see`). Past rows admit nobody by
   themselves: a robot revoked (``servo-serve robots revoke``) reads nothing from then on.
   Anybody else is refused in one line (unsigned: the asker learns nothing it could not guess),
   before any signature is checked.
4. **Signed by that key** (Ed25519, ~80 µs), over the question, this replica's key prefix and
   the nonce (`servo.wire.audit.audit_transcript`).

The answer (an `AuditTail`; operators also get the enrolled robots) is sealed to the query's
ephemeral key and signed by the replica (`servo.wire.sealed`): nobody else reads it, a replayed
query gets an answer only its first asker can read, and a monitor believes only a replica it
trusts.
"""

from __future__ import annotations

from servo._core import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, AuthError
from servo.access import Access, Caller
from servo.server.audit import RecentRequests
from servo.server.manifest import LimitsSection
from servo.server.metrics import ServerMetrics
from servo.server.robots import OpenNonces
from servo.server.signed_door import Signed, SignedDoor
from servo.wire import (
    AUDIT_CONTEXT,
    NONCE_SIZE,
    AuditQuery,
    AuditTail,
    Rejection,
    audit_question,
    audit_transcript,
    encode,
    fingerprint,
)
from servo.wire.sealed import Signer, seal_reply


class AuditDoor(SignedDoor[AuditQuery]):
    """Answers the audit queryable. Event loop (its budget's `DoorBudget.knock`: any thread).

    Args:
        recent: The replica's recent requests.
        nonces: The nonces its status hands out.
        access: The server's admission rule: its operators, and the robots it enrolled (what
            operators are told).
        identity: The replica's identity (signs each answer).
        metrics: Where its signatures and dropped queries are counted.
        limits: ``[limits]``: the door's budgets.
        prefix: The replica's key prefix (bound into what the asker signs).
        replica: The replica's name (bound into what the replica signs).
    """

    request_type = AuditQuery
    door = "audit"

    def __init__(
        self,
        recent: RecentRequests,
        nonces: OpenNonces,
        access: Access,
        identity: Signer,
        metrics: ServerMetrics,
        limits: LimitsSection,
        *,
        prefix: str,
        replica: str,
    ) -> None:
        super().__init__(identity, metrics, limits, prefix=prefix, replica=replica)
        self._recent, self._nonces, self._access = recent, nonces, access

    def malformed(self, request: AuditQuery) -> str | None:
        """Why the query is not one this version's clients send (module docstring, check 1)."""
        if (
            len(request.asker) != PUBLIC_KEY_SIZE
            or len(request.reply_key) != PUBLIC_KEY_SIZE
            or len(request.signature) != SIGNATURE_SIZE
            or len(request.nonce) != NONCE_SIZE
        ):
            return "an audit query is signed by its asker and sealed to its reply key (upgrade the client)"
        return None

    def signed(self, request: AuditQuery) -> tuple[bytes, bytes, bytes]:
        """The asker's key, the transcript it signs, its signature."""
        return request.asker, audit_transcript(request, self.prefix), request.signature

    def admit(self, request: AuditQuery) -> Caller | Rejection:
        """Checks 2 and 3 of the module: fresh, and somebody the admission rule admits now."""
        if not self._nonces.fresh(request.nonce):
            return Rejection(
                "unauthenticated", "the query's nonce is not one this replica handed out recently; ask its status again"
            )
        operator = self._access.operator(request.asker)
        if isinstance(operator, Caller):
            return operator
        robot = self._access.robot(request.client_id, request.asker) if request.client_id else None
        if isinstance(robot, Caller) and request.asker in self._recent.robot_keys(request.client_id):
            return robot
        return Rejection(
            "unauthenticated",
            f"{fingerprint(request.asker)} is no operator of this replica, nor a robot it admits whose requests "
            "it asks for",
        )

    def forged(self, request: AuditQuery) -> str:
        """Why a query whose signature does not verify is refused."""
        return f"the audit query's signature by {fingerprint(request.asker)} does not verify"

    def respond(self, request: AuditQuery, caller: Caller) -> Signed | Rejection:
        """The rows ``caller`` may see, sealed to the query's reply key."""
        fleet = caller.kind != "robot"
        tail = AuditTail(
            self.replica,
            self._recent.tail(request, robot_key=None if fleet else request.asker),
            robots=dict(self._access.rules.robots) if fleet else {},
        )
        try:
            ciphertext, attachment = seal_reply(
                encode(tail),
                client_key=request.reply_key,
                nonce=request.nonce,
                context=AUDIT_CONTEXT,
                question=audit_question(request, self.replica),
                signer=self.signer,
            )
        except AuthError as exc:
            return Rejection("bad_request", f"reply_key refused: {exc}")
        return Signed(ciphertext, attachment)
