"""Errors the edge runtime raises before anything moves."""

from __future__ import annotations

from servo.errors import StartError


class EdgeStartError(StartError, RuntimeError):
    """The edge could not start streaming; one clear message.

    Raised by every engine at start-up (remote: no server or refused; local: the policy does not
    fit the robot; replay: an unusable trajectory). ``refused`` is True when the robot was refused
    (capabilities, joints), False when nothing usable could be reached or read.
    """

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused
