"""When a request is sent again: only once its answer is later than the server's own account allows.

An answer can be lost on the way back (a chunk publisher drops what waits too long for room in a
starved transmit queue) or its observation on the way up; waiting for the request timeout then
costs seconds of fallback. So a request still unanswered after a few round trips is sent again
(`servo.client.session.RemoteSession.resend`): a **copy**, the same observation under the next
seq_id, flagged ``FLAG_COPY``. The server answers a copy from what it holds of the original
(`servo.server.copies`): a copy costs a forward only when the observation never arrived.

A copy is still wasted bandwidth when the answer is merely late, so it is made only when the
answer is overdue by what the server itself says a request takes there now (`ResendRule`):

* before this session's first answer, the replica's status (fetched at placement) bounds the
  wait: a request waits at most one forward for every session ahead of it (newest-wins
  mailboxes, served in turn), so ``sessions * forward`` is added to the allowance: right after
  a failover the survivor's queue is long, and that is not a loss;
* after it, each answer reports its own queue wait and forward: the allowance follows the
  slower of the round trips measured and the server's latest account, so a queue that grows
  is read as a slow server, not as losses.

The allowance is `RESEND_ROUND_TRIPS` times the expected round trip, never under `RESEND_MIN_S`.
"""

from __future__ import annotations

#: An unanswered request is sent again after this many expected round trips...
RESEND_ROUND_TRIPS = 3
#: ...and never sooner than this (s).
RESEND_MIN_S = 0.3


class ResendRule:
    """One session's rule for copies, from what its replica reported. Pure; owned by the event loop.

    Args:
        forward_ms: The replica's forward time in its status at placement (0: not known yet).
        sessions: The sessions the replica held then: each may be served before this one's first request.
    """

    def __init__(self, *, forward_ms: float = 0.0, sessions: int = 0) -> None:
        self._forward_s = forward_ms / 1e3
        self._sessions = sessions
        #: This session's latest answer: its queue wait plus forward (s), as the server reported.
        self._server_s: float | None = None

    def answered(self, queue_wait_ms: float, inference_ms: float) -> None:
        """An answer arrived with the server's account of it."""
        self._server_s = (queue_wait_ms + inference_ms) / 1e3

    def copy_after(self, expected_rtt_ns: int | None) -> float | None:
        """Seconds after a request left at which it is sent again, or None (never).

        ``expected_rtt_ns`` is the slowest of the caller's recent round trips (any replica's):
        with a queue that grows, that costs one copy, not one per request. None while nothing is
        known (no round trip, no forward): a fresh replica's first forward may be any length.
        """
        rtt_s = (expected_rtt_ns or 0) / 1e9
        if self._server_s is not None:
            return max(RESEND_MIN_S, RESEND_ROUND_TRIPS * max(rtt_s, self._server_s))
        if rtt_s <= 0 and self._forward_s <= 0:
            return None
        queue_s = self._sessions * self._forward_s
        return max(RESEND_MIN_S, RESEND_ROUND_TRIPS * max(rtt_s, self._forward_s)) + queue_s
