"""Reading the replies of a control-plane query: only what a check accepts counts.

`sealed_request` sends a session's encrypted control request (reset, close) and `sealed_answer`
takes the first answer that its check accepts (the acks encrypted with the session key); session
opens (`servo.client.trust.pick_ack`) and trajectory fetches (`servo.client.trajectory`) read
their replies with checks of their own. A queryable answers
``reply`` with the expected struct or ``reply_err`` with a `Rejection`; Zenoh adds error replies
of its own (``b"Timeout"`` from a replica that did not finish in time), which are not Rejections
and are skipped. No answer at all is a `RequestTimeout`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import msgspec
import zenoh

from servo._core import AuthError, HeaderError
from servo.client.errors import RequestTimeout, ServerError
from servo.client.protocol import SessionProtocol
from servo.transport import query
from servo.wire import ControlAck, ControlRequest, Rejection, WireError, decode, encode

T = TypeVar("T", bound=msgspec.Struct)


def rejection_of(reply: zenoh.Reply) -> Rejection | None:
    """The server's `Rejection` in an error reply; None for an answer or one of Zenoh's own errors."""
    if reply.err is None:
        return None
    try:
        return decode(reply.err.payload.to_bytes(), Rejection)
    except WireError:
        return None  # Zenoh's own errors (e.g. b"Timeout") are not Rejections


def sealed_answer(
    replies: Iterable[zenoh.Reply],
    check: Callable[[bytes | None, bytes], T],
    *,
    refused: Callable[[str], None],
    unanswered: str,
) -> T:
    """The first answer ``check`` accepts (from its attachment and payload).

    Answers ``check`` refuses (`AuthError`, `HeaderError`, `WireError`) are forgeries or garbage:
    each is reported to ``refused`` and skipped. A server refusal, keyless by design, raises
    only when no accepted answer came.

    Raises:
        ServerError: the server refused.
        RequestTimeout: no accepted answer (``unanswered``).
    """
    rejection: Rejection | None = None
    for reply in replies:
        if reply.err is not None:
            rejection = rejection_of(reply) or rejection
            continue
        if reply.ok is None:
            continue
        attachment = reply.ok.attachment
        try:
            return check(None if attachment is None else attachment.to_bytes(), reply.ok.payload.to_bytes())
        except (AuthError, HeaderError, WireError) as exc:
            refused(str(exc))
    if rejection is not None:
        raise ServerError(rejection.code, rejection.reason)
    raise RequestTimeout(unanswered)


async def sealed_request(
    zsession: zenoh.Session, selector: str, protocol: SessionProtocol, message: ControlRequest, timeout: float
) -> ControlAck:
    """Send ``message`` encrypted with the session's key; return the first reply that key decrypts.

    Forged or unverifiable acks are counted and skipped; a refusal (keyless by design) raises.

    Raises:
        ServerError: the server refused.
        RequestTimeout: no authenticated answer within ``timeout`` s.
    """
    header = protocol.control_header()
    attachment, ciphertext = protocol.key.encrypt(header, encode(message))
    replies = await query(zsession, selector, payload=ciphertext, attachment=attachment, timeout=timeout)

    def refused(problem: str) -> None:
        protocol.counters.reject("mac", f"control ack: {problem}", session_id=protocol.session_id)

    return sealed_answer(
        replies,
        lambda attachment, payload: protocol.open_control_ack(header, attachment, payload),
        refused=refused,
        unanswered=f"{type(message).__name__} not answered within {timeout:g} s",
    )
