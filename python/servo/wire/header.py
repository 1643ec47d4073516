"""The attachment header of a server message, built from the request it answers."""

from __future__ import annotations

from servo._core import Header


def reply_header(request: Header, msg_type: int, *, schema_version: int | None = None) -> Header:
    """The header of a message answering ``request`` (to be encrypted with the session key).

    The request's seq_id, episode_id, session_epoch, client_mono_ns and session_id are echoed (the client
    correlates by them and measures its round trip from its own stamp; clocks never cross
    machines), with ``msg_type``, no flags, and ``schema_version`` when the session negotiated one.
    """
    version = request.schema_version if schema_version is None else schema_version
    return request.replace(msg_type=msg_type, flags=0, schema_version=version)
