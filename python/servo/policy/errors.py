"""Errors of the policy package."""

from servo.errors import PolicyError


class PolicyLoadError(PolicyError, ValueError):
    """The policy cannot be served; the message is one line naming the manifest key to fix.

    Raised for an unknown source, a failing factory, no chunk API, a device that is unavailable or
    not where the weights are, or a warm-up that produced an unusable chunk (the message names
    ``model.source``, ``model.options`` or ``model.device``).
    """


class PolicyOutputError(PolicyError, RuntimeError):
    """The policy returned something that must never reach a robot (wrong shape, NaN, inf)."""
