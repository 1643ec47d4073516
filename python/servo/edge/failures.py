"""What a failed request means, for every engine: one classification of every failure.

============================  ===========================================================
failure                       what happens
============================  ===========================================================
`RequestTimeout`, `SendFailed` counted toward ``timeout_streak``; the streak ends the session
`ServerError`                 counted; ``unknown_session`` ends the session (re-handshake)
`SessionLost`                 ends the session at once
`PolicyFailed`                counted; `MAX_FAILURES_IN_ROW` in a row -> DEAD
anything else                 an engine bug: raised (the runtime parks the arm, DEAD)
============================  ===========================================================

Each request that failed left the robot on its queue and the fallback ladder meanwhile: a
failure is never a reason to command the arm.
"""

from __future__ import annotations

from servo.client import RequestTimeout, SendFailed, ServerError, SessionLost
from servo.edge.failsafe import FailSafe
from servo.errors import PolicyError, ServoError
from servo.logs import Logger, LogThrottle

#: Consecutive policy failures after which a local engine gives up (DEAD).
MAX_FAILURES_IN_ROW = 3


class PolicyFailed(PolicyError):
    """The policy raised while computing a chunk in this process (a bug, or a device error)."""


class SessionEnded(ServoError):
    """The current session is over (lost, timed out, forgotten by the server): handshake again."""


class Failures:
    """Classifies failed requests and keeps the counts. Owned by whichever thread produces chunks.

    Args:
        failsafe: The state machine a failure is reported to.
        log: Where failures are logged, bound to the robot (and its session).
    """

    def __init__(self, failsafe: FailSafe, log: Logger) -> None:
        self.failsafe = failsafe
        self.log = log
        #: Requests answered with an error (server errors, policy exceptions).
        self.errors = 0
        self._in_row = 0
        #: Failed requests: one line per cause per second, with the count held back.
        self._throttle = LogThrottle(1.0)

    def succeeded(self) -> None:
        """A request produced a chunk (or was abandoned by a reset): the policy streak ends."""
        self._in_row = 0

    def failed(self, exc: Exception) -> None:
        """Report a failed request (see the module docstring).

        Raises:
            SessionEnded: the session is gone; the engine must handshake again.
            Exception: ``exc`` itself when it is none of the failures above (an engine bug).
        """
        streak = self.failsafe.config.timeout_streak
        if isinstance(exc, SendFailed):
            # Logged by the session; counts toward the streak like a timeout, but at once.
            if self.failsafe.request_timed_out():
                raise SessionEnded(f"{streak} observations in a row not sent") from None
        elif isinstance(exc, RequestTimeout):
            if (suppressed := self._throttle.allow("timeout")) is not None:
                timeout_s = self.failsafe.config.request_timeout_s
                self.log.warning("request timed out", timeout_s=timeout_s, suppressed=suppressed)
            if self.failsafe.request_timed_out():
                raise SessionEnded(f"{streak} requests in a row timed out") from None
        elif isinstance(exc, ServerError):
            self.errors += 1
            self.failsafe.request_failed()
            if exc.code == "unknown_session":
                raise SessionEnded("server no longer knows this session") from None  # restarted, or collected us
            if (suppressed := self._throttle.allow(exc.code)) is not None:
                self.log.warning("server refused request", code=exc.code, reason=exc.message, suppressed=suppressed)
        elif isinstance(exc, SessionLost):
            raise SessionEnded(str(exc)) from None
        elif isinstance(exc, PolicyFailed):
            self.errors += 1
            self._in_row += 1
            self.failsafe.request_failed()
            self.log.error("local inference failed", exc_info=exc)
            if self._in_row >= MAX_FAILURES_IN_ROW:
                self.failsafe.fatal(f"policy failed {self._in_row} times in a row: {exc}")
        else:
            raise exc
