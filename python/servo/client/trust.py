"""Which servers a client trusts, how it tells a real session ack from a forgery, and how it signs.

A replica proves who it is by signing each session ack with its Ed25519 identity
(`servo.wire.trust.ack_transcript`). A client:

* with ``trusted_servers`` pins (fingerprints ``ed25519:…`` and/or replica ids) only considers
  replicas whose status names a pinned identity or replica id, and only accepts an ack signed by
  that identity;
* without pins considers only replicas whose identity it trusts for the deployment on first use
  (`servo.client.known`), and still only accepts an ack signed by the identity the replica's
  status advertised: a peer that answers the session query in the real replica's place cannot
  sign it, so it is skipped and the real ack is used.

A robot proves who it is by signing its session open (`signed_open`) with its own identity, and,
when it joins with a token, proves the token too (`servo.join`).

A replica-id pin names a key segment anybody can answer on; it means something only behind a
``servo-router`` whose access control lets nobody but fleet servers answer (docs/guides/security.md).
Fingerprint pins hold on any network.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
import zenoh

from servo._core import verify_signature
from servo.client.errors import RequestTimeout, RogueServer, SessionRejected
from servo.client.replies import rejection_of
from servo.client.verify import ClientCounters
from servo.identity import Identity
from servo.join import JoinToken, sign_join
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    Rejection,
    ServerKeys,
    SessionAck,
    SessionOpen,
    StatusReply,
    WireError,
    ack_transcript,
    decode,
    encode,
    fingerprint,
    open_transcript,
    parse_fingerprint,
    segment,
)


@dataclass(frozen=True)
class TrustedServers:
    """The servers a client pins; when empty, trust on first use decides (frozen, shareable).

    Args:
        identities: Pinned Ed25519 public keys (32 bytes each).
        replicas: Pinned replica ids.
    """

    identities: frozenset[bytes] = frozenset()
    replicas: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> TrustedServers:
        """Pins from text: ``ed25519:…`` fingerprints and replica ids.

        Raises:
            WireError: a malformed fingerprint, or a replica id that is no valid key segment.
        """
        identities, replicas = set(), set()
        for entry in entries:
            if entry.startswith("ed25519:"):
                identities.add(parse_fingerprint(entry))
            else:
                replicas.add(segment(entry, what="trusted replica id"))
        return cls(frozenset(identities), frozenset(replicas))

    @property
    def pinned(self) -> bool:
        """Whether anything is pinned."""
        return bool(self.identities or self.replicas)

    def trusts(self, replica: str, identity: bytes) -> bool:
        """Whether a replica advertising ``identity`` may serve this client."""
        return not self.pinned or identity in self.identities or replica in self.replicas

    def check_status(self, keys: ServerKeys, status: StatusReply) -> str | None:
        """Why a status reply must be skipped (None: usable)."""
        if (status.app, status.model_key, status.replica) != (keys.app, keys.model, keys.replica):
            return f"status names {status.app}/{status.model_key}/{status.replica} but came from {keys.prefix}"
        if not self.trusts(keys.replica, status.identity):
            return f"identity {fingerprint(status.identity)} is not trusted"
        return None


def signed_open(
    request: SessionOpen, identity: Identity, *, prefix: str, nonce: bytes, join: JoinToken | None = None
) -> SessionOpen:
    """``request`` signed by the robot ``identity`` for the replica ``prefix`` with its status ``nonce``.

    Signed as the server will decode it (`servo.wire.trust.open_transcript`): the request is
    normalised through its encoding first (an int fps becomes a float on the way). With ``join``,
    the open names the token and carries its proof over the signed open.
    """
    named = msgspec.structs.replace(
        request, robot_key=identity.public_key, nonce=nonce, join_id="" if join is None else join.id
    )
    request = decode(encode(named), SessionOpen)
    request = msgspec.structs.replace(request, robot_signature=identity.sign(open_transcript(request, prefix)))
    return request if join is None else sign_join(request, join, prefix)


def pick_ack(
    replies: Iterable[zenoh.Reply],
    *,
    keys: ServerKeys,
    status: StatusReply,
    client_key: bytes,
    counters: ClientCounters,
    timeout: float,
) -> SessionAck:
    """The one genuine ack among the replies to a session open.

    An ack counts only if it decodes, names the replica asked, carries the identity the replica's
    status advertised, and its signature over the transcript verifies. Forgeries are counted
    (``rogue_servers``) and skipped, so a peer that answers first cannot hijack the handshake.

    Raises:
        SessionRejected: no genuine ack, and the replica refused (``rejection.code``).
        RogueServer: only forged or unverifiable acks came back.
        RequestTimeout: nobody answered.
    """
    rejection: Rejection | None = None
    forged = 0
    for reply in replies:
        if reply.err is not None:
            rejection = rejection_of(reply) or rejection
            continue
        if reply.ok is None:
            continue
        problem = None
        try:
            ack = decode(reply.ok.payload.to_bytes(), SessionAck)
        except WireError as exc:
            problem = f"undecodable session ack: {exc}"
        else:
            problem = _ack_problem(ack, keys, status, client_key)
        if problem is None:
            return ack
        forged += 1
        counters.rogue(keys.replica, problem)
    if rejection is not None:
        raise SessionRejected(rejection)
    if forged:
        raise RogueServer(f"replica {keys.replica}: {forged} session ack(s) failed verification")
    raise RequestTimeout(f"session open not answered within {timeout:g} s")


def _ack_problem(ack: SessionAck, keys: ServerKeys, status: StatusReply, client_key: bytes) -> str | None:
    if ack.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        return (
            f"ack settles on schema_version {ack.schema_version}, this client speaks {list(SUPPORTED_SCHEMA_VERSIONS)}"
        )
    if ack.replica != keys.replica:
        return f"ack names replica {ack.replica!r}, asked {keys.replica!r}"
    if ack.server_identity != status.identity:
        return f"ack signed as {fingerprint(ack.server_identity)}, status advertised {fingerprint(status.identity)}"
    transcript = ack_transcript(client_key, ack.server_key, ack.session_id, ack.replica, ack.operators)
    if not verify_signature(ack.server_identity, transcript, ack.signature):
        return "ack signature does not verify"
    return None
