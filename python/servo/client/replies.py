"""Reading the replies of a control-plane query.

`read_reply` takes the first answer as it is; `sealed_answer` only one that a check accepts (the
acks of sealed control requests: reset, close). Session opens (`servo.client.trust.pick_ack`)
read their replies with their own checks. A queryable answers
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
from servo.client.errors import ClientError, RequestTimeout, ServerError
from servo.transport import query
from servo.wire import Rejection, WireError, decode, encode

T = TypeVar("T", bound=msgspec.Struct)


def server_error(rejection: Rejection) -> ClientError:
    """The default reading of a rejection: a `ServerError` with its code and reason."""
    return ServerError(rejection.code, rejection.reason)


def rejection_of(reply: zenoh.Reply) -> Rejection | None:
    """The server's `Rejection` in an error reply; None for an answer or one of Zenoh's own errors."""
    if reply.err is None:
        return None
    try:
        return decode(reply.err.payload.to_bytes(), Rejection)
    except WireError:
        return None  # Zenoh's own errors (e.g. b"Timeout") are not Rejections


def read_reply(
    replies: Iterable[zenoh.Reply],
    reply_type: type[T],
    *,
    unanswered: str,
    rejected: Callable[[Rejection], ClientError] = server_error,
) -> T:
    """The first answer among ``replies``, decoded as ``reply_type``.

    Args:
        replies: What the query collected.
        reply_type: The struct an accepted request is answered with.
        unanswered: The `RequestTimeout` message when nobody answered.
        rejected: Turns the server's `Rejection` into the exception to raise.

    Raises:
        ClientError: from ``rejected``, when the server refused.
        RequestTimeout: no answer (Zenoh's own error replies do not count).
        WireError: the answer does not decode as ``reply_type``.
    """
    for reply in replies:
        if reply.ok is not None:
            return decode(reply.ok.payload.to_bytes(), reply_type)
        if (rejection := rejection_of(reply)) is not None:
            raise rejected(rejection)
    raise RequestTimeout(unanswered)


async def request(
    zsession: zenoh.Session,
    selector: str,
    body: msgspec.Struct,
    reply_type: type[T],
    *,
    timeout: float,
    what: str,
    rejected: Callable[[Rejection], ClientError] = server_error,
    target: zenoh.QueryTarget = zenoh.QueryTarget.ALL,
) -> T:
    """Send ``body`` to ``selector`` and return the answer (see `read_reply`).

    ``what`` names the request in the timeout message: "{what} not answered within {timeout} s".
    """
    replies = await query(zsession, selector, payload=encode(body), timeout=timeout, target=target)
    return read_reply(replies, reply_type, unanswered=f"{what} not answered within {timeout:g} s", rejected=rejected)


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
