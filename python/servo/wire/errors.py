"""The one error type of the wire layer."""

from servo.errors import ProtocolError


class WireError(ProtocolError, ValueError):
    """A message, tensor, image or key expression that violates the protocol.

    The message names what was wrong (field, expected and actual values) so it can be sent back to
    the peer verbatim.
    """
