"""The server side of the session layer (wire schema 3): handshake and per-message verification.

Nothing a client sends is acted on before it passed the checks here.

* **Handshake** (`accept_handshake`): a random 128-bit session id, an ephemeral X25519 key pair,
  the session keys derived from both public keys (the secret never crosses the wire), and the
  replica's Ed25519 signature over the transcript, so the edge can tell it is talking to the
  identity it trusts.
* **Observations** (`verify_observation`), in this order: the session of the client named by the
  key; a decodable header of type OBS naming that session; the size bound; the AEAD tag over
  header and encrypted body, which decrypts it (`servo._core.SessionKey.decrypt`: bodies are
  encrypted end to end, so nobody on a link reads them); the session epoch; a seq_id strictly
  above the last accepted one (replay protection).
  Anything else is refused with a `Refused` whose ``reason`` labels the metric; it is never
  answered with a chunk.
* **Control requests** (`verify_control`): the same checks on the query's attachment (type
  CONTROL, its own seq_id stream: a reset travels beside the observation in flight and may
  overtake it).
* **Takeover** (`takeover`): when a second open names a client that already has a session here,
  the new session replaces the old one only if it is signed by the same robot identity (a robot
  that restarted; `servo.server.robots` already refused replays), proves it holds the old
  session's key (``SessionOpen.resume``), or the old client is gone (its liveliness token
  vanished, or it sent no authenticated observation for ``idle_s``). Otherwise the open is
  refused with ``session_exists``: nobody can cut a live robot's session by opening one under
  its name.

Everything here is pure verification over the state in `SessionAuth`; the data plane (mailboxes,
decoder, worker) only ever sees what passed.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import zenoh

from servo._core import (
    ATTACHMENT_SIZE,
    MSG_CONTROL,
    MSG_OBS,
    SESSION_ID_SIZE,
    AuthError,
    Header,
    HeaderError,
    KeyPair,
    ServerIdentity,
    SessionKey,
    decode_header,
)
from servo.errors import SecurityError
from servo.wire import SessionOpen, ack_transcript, resume_body

#: Why a client message was refused (the ``reason`` label of the rejection counters).
Reason = Literal["key", "header", "session", "too_large", "mac", "epoch", "replay", "stale", "rate", "image"]
#: The two sequence-number streams of a session, each with its own replay window.
Stream = Literal["obs", "control"]


class Refused(SecurityError):
    """A client message failed verification.

    Attributes:
        reason: The counter label (see `Reason`).
        header: The header as it claimed to be (unauthenticated), when it decoded: the keyless
            ``unknown_session`` notice echoes it.
    """

    def __init__(self, reason: Reason, detail: str, header: Header | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.header = header


@dataclass
class SessionAuth:
    """What one session needs to authenticate its client.

    Made by `accept_handshake`; owned by its `Session`. The observation stream is checked on the
    Zenoh subscriber thread and the control stream on the event loop; each stream has its own
    replay counter, and one lock orders them anyway (held for a few integer compares).
    """

    key: SessionKey
    wire_id: bytes
    epoch: int
    #: The Ed25519 identity that signed the open (`servo.server.robots`).
    robot_key: bytes = b""
    last_obs_seq: int = 0
    last_control_seq: int = 0
    #: Monotonic time of the open or of the last authenticated observation: what counts as
    #: activity for idle eviction and the takeover rule (control requests do not: a squatter
    #: that only resets keeps nothing alive).
    last_observation_ns: int = field(default_factory=time.monotonic_ns)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def session_id(self) -> str:
        """The session id as Python shows it: 32 lowercase hex characters."""
        return self.wire_id.hex()

    def _accept(self, header: Header, stream: Stream) -> Header:
        with self._lock:
            if header.session_epoch != self.epoch:
                raise Refused("epoch", f"epoch {header.session_epoch}, the session's is {self.epoch}", header)
            last = self.last_obs_seq if stream == "obs" else self.last_control_seq
            if header.seq_id <= last:
                raise Refused("replay", f"seq_id {header.seq_id} is not above the last accepted {last}", header)
            if stream == "obs":
                self.last_obs_seq = header.seq_id
                self.last_observation_ns = time.monotonic_ns()
            else:
                self.last_control_seq = header.seq_id
            return header

    def open(self, attachment: bytes, body: zenoh.ZBytes | bytes, stream: Stream) -> tuple[Header, bytes]:
        """Verify and decrypt a message of this session's client (tag, epoch, replay), taking its seq_id.

        Returns the authenticated header and the plaintext body (a body still in Zenoh is copied
        out once and decrypted in that copy).

        Raises:
            Refused: ``mac``, ``epoch`` or ``replay``.
        """
        shared = body.as_shm() if isinstance(body, zenoh.ZBytes) else None
        try:
            # Out of shared memory the copy is a plain one; Zenoh's own zero-fills its bytes first.
            header, plaintext = self.key.decrypt(attachment, body if shared is None else shared)
        except (AuthError, HeaderError) as exc:
            raise Refused("mac", str(exc)) from None
        return self._accept(header, stream), plaintext

    def verify_proof(self, attachment: bytes, data: bytes) -> Header:
        """Verify a proof this session's client made over ``data`` (a resume proof) and take its seq_id.

        Raises:
            Refused: ``mac``, ``epoch`` or ``replay``.
        """
        try:
            header = self.key.verify(attachment, data)
        except (AuthError, HeaderError) as exc:
            raise Refused("mac", str(exc)) from None
        return self._accept(header, "control")


@dataclass(frozen=True)
class Handshake:
    """The server's half of a session open: the session's auth state and what the ack carries.

    Made and consumed by the control plane on the event loop (frozen).
    """

    auth: SessionAuth
    server_key: bytes
    signature: bytes


def accept_handshake(
    request: SessionOpen, identity: ServerIdentity, replica: str, operators: Sequence[bytes] = ()
) -> Handshake:
    """Make the session id and key for ``request`` and sign the transcript (naming ``operators``).

    Raises:
        Refused: (``header``) the client key is unusable (e.g. a low-order X25519 point).
    """
    session_id = secrets.token_bytes(SESSION_ID_SIZE)
    pair = KeyPair()
    try:
        key = pair.session_key(
            request.client_key,
            client_public=request.client_key,
            server_public=pair.public_key,
            session_id=session_id,
        )
    except AuthError as exc:
        raise Refused("header", f"client_key refused: {exc}") from None
    signature = identity.sign(ack_transcript(request.client_key, pair.public_key, session_id, replica, operators))
    auth = SessionAuth(key, session_id, request.session_epoch, robot_key=request.robot_key)
    return Handshake(auth, pair.public_key, signature)


def peek(attachment: bytes | None, msg_type: int) -> Header:
    """The header an attachment claims (unauthenticated: for routing only).

    Raises:
        Refused: (``header``) missing, undecodable, or not of type ``msg_type``.
    """
    if attachment is None:
        raise Refused("header", "no attachment header")
    try:
        header = decode_header(attachment)
    except HeaderError as exc:
        raise Refused("header", str(exc)) from None
    if header.msg_type != msg_type:
        raise Refused("header", f"msg_type {header.msg_type}, expected {msg_type}", header)
    return header


def attachment_bytes(raw: zenoh.ZBytes | bytes | None) -> bytes | None:
    """A message's attachment, copied out of Zenoh only at the one size a servo attachment has.

    Raises:
        Refused: (``header``) any other size: a peer cannot make a callback copy a huge one.
    """
    if raw is None or isinstance(raw, bytes):
        return raw
    if len(raw) != ATTACHMENT_SIZE:
        raise Refused("header", f"attachment is {len(raw)} bytes, expected {ATTACHMENT_SIZE}")
    return raw.to_bytes()


def verify_observation(
    auth: SessionAuth | None,
    raw_attachment: zenoh.ZBytes | bytes | None,
    payload: zenoh.ZBytes | bytes,
    *,
    max_bytes: int,
) -> tuple[Header, bytes]:
    """Authenticate one observation of the client whose session is ``auth`` (None: it has none).

    Returns the authenticated header and the decrypted body (copied out of Zenoh only once the
    cheap checks passed).

    Raises:
        Refused: ``header``, ``session``, ``too_large``, ``mac``, ``epoch`` or ``replay``.
    """
    return _verify(auth, raw_attachment, payload, MSG_OBS, "obs", "observation", max_bytes)


def verify_control(
    auth: SessionAuth | None,
    raw_attachment: zenoh.ZBytes | bytes | None,
    payload: zenoh.ZBytes | bytes,
    *,
    max_bytes: int,
) -> tuple[Header, bytes]:
    """Authenticate one control request (reset, close) of the client whose session is ``auth``.

    Returns the authenticated header and the decrypted body. The size bound comes before the copy
    and the decryption, as for observations: nobody makes the event loop copy or decrypt an
    unbounded body.

    Raises:
        Refused: ``header``, ``session``, ``too_large``, ``mac``, ``epoch`` or ``replay``.
    """
    return _verify(auth, raw_attachment, payload, MSG_CONTROL, "control", "control request", max_bytes)


def _verify(
    auth: SessionAuth | None,
    raw_attachment: zenoh.ZBytes | bytes | None,
    payload: zenoh.ZBytes | bytes,
    msg_type: int,
    stream: Stream,
    what: str,
    max_bytes: int,
) -> tuple[Header, bytes]:
    """The one path of every client message, cheapest check first.

    Attachment size, header, session, body size, then the copy and the decryption: nothing is
    copied or decrypted before it is bounded.
    """
    attachment = attachment_bytes(raw_attachment)
    claimed = peek(attachment, msg_type)
    assert attachment is not None
    if auth is None or claimed.session_id != auth.wire_id:
        raise Refused("session", f"no session {claimed.session_id.hex()} for this client", claimed)
    size = len(payload)
    if size > max_bytes:
        raise Refused("too_large", f"{what} of {size} bytes exceeds the limit of {max_bytes}", claimed)
    return auth.open(attachment, payload, stream)


Takeover = Literal["same_robot", "resumed", "vanished", "idle"]


def takeover(old: SessionAuth, request: SessionOpen, *, client_present: bool, idle_s: float) -> Takeover | None:
    """Whether a new open under the same client id may replace the session ``old``, and why.

    * ``same_robot``: the open is signed by the robot identity that opened ``old`` (checked,
      fresh and not a replay: `servo.server.robots`), e.g. the robot restarted;
    * ``resumed``: ``request.resume`` is the old session's proof over the new client key (and its
      seq_id continues the old control stream, so a captured proof cannot be replayed);
    * ``vanished``: the client's liveliness token is gone, never appeared, or vanished at least
      once since the open (a token under the name now may belong to a restarted client; a
      peer cannot make another's token vanish);
    * ``idle``: no authenticated observation came from the old session for ``idle_s`` (a client
      that restarted before its old token expired would otherwise be locked out for good);
    * None: the old session is live and the request proves nothing: refuse it.
    """
    if old.robot_key and request.robot_key == old.robot_key:
        return "same_robot"
    if request.resume:
        try:
            claimed = peek(request.resume, MSG_CONTROL)
            if claimed.session_id == old.wire_id:
                old.verify_proof(request.resume, resume_body(request.client_key))
                return "resumed"
        except Refused:
            pass
    if not client_present:
        return "vanished"
    if time.monotonic_ns() - old.last_observation_ns > idle_s * 1e9:
        return "idle"
    return None
