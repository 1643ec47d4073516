"""The client side of one session, as a protocol over bytes: what to encrypt, what to believe.

`SessionProtocol` holds a session's keys and counters and decides, for every message the server
sends, whether it may touch the request in flight. It takes plain bytes and returns decisions
(`Verdict`); it never touches Zenoh, a thread or the event loop, so every rule below is tested
with bytes (tests/client/test_protocol.py), as `servo.server.auth` is on the server side.

* **Outgoing**: each observation gets the next seq_id of the observation stream (`observation`),
  each control request the next of the control stream (`control_header`); both are encrypted
  with the session key by whoever sends them (`servo._core.SessionKey.encrypt`).
* **One request in flight**: a new observation supersedes the request in flight; only an
  answer to the latest seq_id of the current epoch is accepted, once. A copy (``resend``: the
  same observation under the next seq_id, when `servo.client.resend` says its answer is overdue)
  is the one exception: the first answer to either seq_id is taken, since both answer that
  observation, and the other one, when it comes, is expected (``stats.copy_answers``), not refused.
* **Incoming** (`on_action`), in this order: sizes (`oversized`, before anything is copied out
  of Zenoh); the tag under the session key, which decrypts the body; the session id and epoch;
  the message type; the request in flight; the body (`servo.client.verify`). The ``unknown_session`` notice is the
  one message without the session key (the server that sends it no longer holds one): it ends
  the request in flight only when it echoes it and is signed by the replica's identity, the one
  the ack was signed by, for this client (`servo.wire.trust.notice_transcript`); at most `MAX_NOTICE_CHECKS`
  signatures are checked per request, so a flood of forgeries costs a bounded ~0.1 ms each.
  Anything else is dropped and counted by reason.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servo._core import (
    ATTACHMENT_SIZE,
    FLAG_COPY,
    FLAG_EPISODE_START,
    MSG_CHUNK,
    MSG_CONTROL,
    MSG_CONTROL_ACK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    SCHEMA_VERSION,
    SIGNATURE_SIZE,
    TAG_SIZE,
    AuthError,
    Header,
    HeaderError,
    SessionKey,
    decode_header,
    verify_signature,
)
from servo.client.errors import ServerError, SessionLost
from servo.client.resend import ResendRule
from servo.client.results import ChunkResult, SessionStats
from servo.client.verify import MAX_CHUNK_STEPS, ChunkRejected, ClientCounters, read_chunk
from servo.wire import (
    ControlAck,
    DrainNotice,
    ErrorEvent,
    SessionAck,
    WireError,
    decode,
    notice_transcript,
    resume_body,
)

FloatArray = npt.NDArray[np.float32]

#: Room in a server message beyond its chunk tensors (header fields, an error's text): anything
#: larger on the action key is dropped before it is copied out of Zenoh.
MESSAGE_SLACK_BYTES = 1 << 20
#: Signatures of keyless notices checked per request, at most (each check costs ~0.1 ms).
MAX_NOTICE_CHECKS = 8
#: Seq_ids of answered copied requests whose other answer may still come (counted as expected).
LATE_COPIES = 8


@dataclass(frozen=True)
class Answered:
    """The request in flight is answered: a verified chunk, or the server's error for it."""

    result: ChunkResult | ServerError


@dataclass(frozen=True)
class Lost:
    """The session is over (an authenticated drain notice)."""

    reason: str


@dataclass(frozen=True)
class Dropped:
    """The message must not touch the session; it was counted."""


#: What one server message means for the session.
Verdict = Answered | Lost | Dropped


class SessionProtocol:
    """One session's keys, sequence numbers and request in flight. Owned by the event loop.

    ::

        created ──established(ack, key)──► open ──observation()──► in flight ──on_action: Answered──► open
                                                                      │  ▲
                                                                      └──┘ observation(): the newer one wins

    Args:
        epoch: The session epoch chosen at open (the caller bumps it at every reconnect).
        action_dim: The robot's action dimension (a chunk of another width is refused).
        counters: Refusals, shared with the `PolicyClient` that opened the session.
        max_chunk_steps: Longest chunk accepted.
        downsize: Take the ack's offer of smaller frames (``input_sizes``); False sends them as given.
        action_key: This client's action key on the replica (what a keyless notice is signed for).
        server_identity: The replica's trusted identity (what signs a keyless notice).
    """

    def __init__(
        self,
        *,
        epoch: int,
        action_dim: int,
        counters: ClientCounters,
        max_chunk_steps: int = MAX_CHUNK_STEPS,
        downsize: bool = True,
        action_key: str = "",
        server_identity: bytes = b"",
    ) -> None:
        self.epoch = epoch
        self.action_key = action_key
        self.server_identity = server_identity
        self.action_dim = action_dim
        self.max_chunk_steps = max_chunk_steps
        self.counters = counters
        self.stats = SessionStats()
        self.episode_id = 0
        self.ack: SessionAck | None = None
        #: The (height, width) the server takes each camera at when smaller than declared (its ack's
        #: offer, taken unless ``downsize`` is off): frames are shrunk to it before they are sent.
        self.input_sizes: dict[str, tuple[int, int]] = {}
        self._downsize = downsize
        #: The answer to the latest request, once it came (None while in flight).
        self.result: ChunkResult | Exception | None = None
        self.latest_seq = 0
        #: The seq_id the latest request was sent again for (its answer counts too), or 0.
        self.resent_seq = 0
        #: When a request is sent again (`servo.client.resend`); the session sets the replica's.
        self.resend = ResendRule()
        #: The other seq_id of each copied request answered lately: its answer is expected.
        self._late_copies: deque[int] = deque(maxlen=LATE_COPIES)
        # The largest chunk (both spaces, float32) plus room for the rest of any server message.
        self.max_message_bytes = 2 * max_chunk_steps * action_dim * 4 + MESSAGE_SLACK_BYTES
        self._key: SessionKey | None = None
        self._wire_id = bytes(16)
        self._seq = 0
        self._control_seq = 0
        self._notice_checks = 0

    # ------------------------------------------------------------------ keys and ids
    def established(self, ack: SessionAck, key: SessionKey) -> None:
        """The handshake is done: from now on messages are encrypted and decrypted with ``key``."""
        self.ack, self._key, self._wire_id = ack, key, ack.session_id
        if self._downsize:
            self.input_sizes = {name: (cam.height, cam.width) for name, cam in ack.input_sizes.items()}

    @property
    def key(self) -> SessionKey:
        """The session key (the handshake's secret result; never sent anywhere).

        Raises:
            SessionLost: before the handshake.
        """
        if self._key is None:
            raise SessionLost("the session is not open yet")
        return self._key

    @property
    def wire_id(self) -> bytes:
        """Server-assigned id as it travels in headers: 16 bytes (zero before the ack)."""
        return self._wire_id

    @property
    def session_id(self) -> str:
        """Server-assigned id: 32 lowercase hex characters ("" before the ack)."""
        return "" if self.ack is None else self._wire_id.hex()

    @property
    def schema_version(self) -> int:
        """The version the ack settled on (this build's before the ack)."""
        return self.ack.schema_version if self.ack else SCHEMA_VERSION

    @property
    def in_flight(self) -> int | None:
        """seq_id of the request awaiting its answer, if any."""
        return self.latest_seq if self.result is None and self.latest_seq else None

    # ------------------------------------------------------------------ outgoing
    def observation(self, *, mono_ns: int, episode_start: bool, resend: bool = False) -> Header:
        """The header of the next observation; it becomes the request in flight.

        With ``resend`` it carries the observation in flight again, flagged ``FLAG_COPY``: an answer
        to either seq_id is taken (the first one), the notice budget stays that request's, and it
        is counted (``stats.resent``, and the client's ``counters.resent`` over all its sessions).

        Raises:
            SessionLost: before the handshake.
            ValueError: ``resend`` with no request in flight.
        """
        if self._key is None:
            raise SessionLost("the session is not open yet")
        if resend and self.in_flight is None:
            raise ValueError("no request in flight to send again")
        self._seq += 1
        self.resent_seq = self.latest_seq if resend else 0
        if resend:
            self.stats.resent += 1
            self.counters.resent += 1
        else:
            self._notice_checks = 0
        self.latest_seq, self.result = self._seq, None
        return Header(
            schema_version=self.schema_version,
            msg_type=MSG_OBS,
            flags=(FLAG_EPISODE_START if episode_start else 0) | (FLAG_COPY if resend else 0),
            seq_id=self._seq,
            episode_id=self.episode_id,
            session_epoch=self.epoch,
            client_mono_ns=mono_ns,
            session_id=self._wire_id,
        )

    def control_header(self) -> Header:
        """The header of the next control request (its own seq_id stream)."""
        self._control_seq += 1
        return Header(
            self.schema_version, MSG_CONTROL, 0, self._control_seq, self.episode_id, self.epoch, 0, self._wire_id
        )

    def resume_proof(self, client_key: bytes) -> bytes:
        """A proof that this client held this session, for a new open on the same replica.

        This session key's proof over the new handshake's ``client_key`` (see
        `servo.wire.trust.resume_body`); it lets the new session replace this one even when the
        close never reached the server. Empty before the handshake.
        """
        if self._key is None:
            return b""
        return self._key.authenticate(self.control_header(), resume_body(client_key))

    def fail(self, seq_id: int, error: Exception) -> bool:
        """Observation ``seq_id`` never left: it fails with ``error`` if it is the request in flight."""
        if seq_id != self.latest_seq or self.result is not None:
            return False
        self.result = error
        return True

    # ------------------------------------------------------------------ incoming
    def open_control_ack(self, sent: Header, attachment: bytes | None, payload: bytes) -> ControlAck:
        """The ack of control request ``sent``, if encrypted by the session key and answering it.

        Raises:
            AuthError: unauthenticated, or the ack answers another request.
            HeaderError, WireError: an authentic ack that does not decode.
        """
        if attachment is None:
            raise AuthError("no attachment")
        answered, body = self.key.decrypt(attachment, payload)
        if (answered.msg_type, answered.seq_id, answered.session_id) != (MSG_CONTROL_ACK, sent.seq_id, self._wire_id):
            raise AuthError("the ack answers another request")
        return decode(body, ControlAck)

    def oversized(self, attachment_size: int | None, payload_size: int) -> ChunkRejected | None:
        """Why a server message is too big to be copied out of Zenoh at all (None: it is not).

        Pure, so the Zenoh callback thread may ask before it copies: whoever can publish on the
        action key must not make anyone copy a huge message. Count a refusal with `refuse`.
        """
        if attachment_size is not None and attachment_size != ATTACHMENT_SIZE:
            return ChunkRejected("mac", f"attachment of {attachment_size} bytes")
        if payload_size > self.max_message_bytes:
            return ChunkRejected("undecodable", f"message of {payload_size} bytes exceeds {self.max_message_bytes}")
        return None

    def refuse(self, refused: ChunkRejected) -> None:
        """Count a server message refused before it reached `on_action`."""
        self.counters.reject(refused.reason, str(refused), session_id=self.session_id)

    def on_action(self, attachment: bytes | None, payload: bytes, now_ns: int) -> Verdict:
        """What a message on the session's action key means (its sizes passed `oversized`).

        Only what verifies may touch the request in flight; everything else is counted by reason.
        """
        try:
            opened = self._authenticate(attachment, payload)
        except ChunkRejected as exc:
            self.counters.reject(exc.reason, str(exc), session_id=self.session_id)
            return Dropped()
        if opened is None:
            assert attachment is not None
            return self._keyless_hint(attachment, payload)
        header, body = opened
        if header.msg_type == MSG_DRAIN:
            try:
                return Lost(decode(body, DrainNotice).reason)
            except WireError:
                return Lost("server draining")
        if header.msg_type not in (MSG_CHUNK, MSG_ERROR):
            self.counters.reject("undecodable", f"msg_type {header.msg_type} on the action key")
            return Dropped()
        if header.seq_id in self._late_copies:
            self._late_copies.remove(header.seq_id)  # the other answer of a copied request
            self.stats.copy_answers += 1
            return Dropped()
        answers = header.seq_id == self.latest_seq or (self.resent_seq != 0 and header.seq_id == self.resent_seq)
        if not answers or self.result is not None:
            # Late or replayed answer: merging it would corrupt the queue (one in flight).
            self.stats.dropped_stale += 1
            self.counters.reject("stale_seq", f"seq {header.seq_id}, in flight {self.in_flight}")
            return Dropped()
        if self.resent_seq:
            self._late_copies.append(self.resent_seq if header.seq_id == self.latest_seq else self.latest_seq)
        return Answered(self._answer(header, body, now_ns))

    def _answer(self, header: Header, payload: bytes, now_ns: int) -> ChunkResult | ServerError:
        """The request in flight's result from its authenticated answer (an unusable chunk fails it)."""
        result: ChunkResult | ServerError
        try:
            if header.msg_type == MSG_CHUNK:
                result = read_chunk(header, payload, now_ns, action_dim=self.action_dim, max_steps=self.max_chunk_steps)
                self.resend.answered(result.queue_wait_ms, result.inference_ms)
                self.stats.chunks += 1
            else:
                event = decode(payload, ErrorEvent)
                result = ServerError(event.code, event.message)
                self.stats.errors += 1
        except ChunkRejected as exc:
            self.stats.undecodable += 1
            self.counters.reject(exc.reason, str(exc), session_id=self.session_id, seq_id=header.seq_id)
            result = ServerError("bad_chunk", f"{exc.reason}: {exc}")
        except WireError as exc:
            self.stats.undecodable += 1
            self.counters.reject("undecodable", str(exc), session_id=self.session_id, seq_id=header.seq_id)
            result = ServerError("undecodable", str(exc))
        self.result = result
        return result

    def _authenticate(self, attachment: bytes | None, payload: bytes) -> tuple[Header, bytes] | None:
        """The verified header and decrypted body of a server message, or None for a keyless notice.

        Raises:
            ChunkRejected: ``mac``, ``session`` or ``epoch``.
        """
        if attachment is None or self._key is None:
            raise ChunkRejected("mac" if self._key else "session", "no attachment" if self._key else "no session yet")
        if attachment[-TAG_SIZE:] == bytes(TAG_SIZE):
            return None
        try:
            header, body = self._key.decrypt(attachment, payload)
        except (AuthError, HeaderError) as exc:
            raise ChunkRejected("mac", str(exc)) from None
        if header.session_id != self._wire_id:
            raise ChunkRejected("session", f"session {header.session_id.hex()}, ours is {self.session_id}")
        if header.session_epoch != self.epoch:
            self.stats.dropped_stale += 1
            raise ChunkRejected("epoch", f"epoch {header.session_epoch}, ours is {self.epoch}")
        return header, body

    def _keyless_hint(self, attachment: bytes, payload: bytes) -> Verdict:
        """A keyless message counts only as a signed ``unknown_session`` notice for the request in flight.

        It re-opens the session (nothing more), and only when the replica's identity signed it
        for this replica and this request: a forger gains nothing.
        """
        event = None
        with contextlib.suppress(HeaderError, WireError):
            header = decode_header(attachment)
            # The cheap header checks first: an unauthenticated body is decoded only when it
            # could be the notice for the request in flight.
            expected = (MSG_ERROR, self._wire_id, self.latest_seq)
            if (header.msg_type, header.session_id, header.seq_id) == expected and self.result is None:
                event = decode(payload, ErrorEvent)
        if event is None or event.code != "unknown_session" or self._notice_checks >= MAX_NOTICE_CHECKS:
            self.counters.reject("mac", "unauthenticated message", session_id=self.session_id)
            return Dropped()
        self._notice_checks += 1
        transcript = notice_transcript(self.action_key, attachment, event.code, event.message)
        signature = event.signature
        if len(signature) != SIGNATURE_SIZE or not verify_signature(self.server_identity, transcript, signature):
            self.counters.reject("mac", "unknown_session notice not signed by the replica", session_id=self.session_id)
            return Dropped()
        self.counters.unknown_session_hints += 1
        self.result = error = ServerError(event.code, event.message)
        return Answered(error)
