"""The typed keyword options of `servo.client.PolicyClient`'s entry points.

``PolicyClient.connect(settings, client_id, **ClientOptions)`` and
``client.session(features=…, fps=…, **PlacementOptions)`` take these keywords, checked by type
checkers and completed by IDEs like explicit parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Literal, TypedDict

from servo.client.codec import AutoCodec
from servo.client.discovery import ServerInfo
from servo.client.known import KnownServers
from servo.client.session import RemoteSession
from servo.client.trust import TrustedServers
from servo.identity import Identity
from servo.join import JoinToken
from servo.wire import ServerKeys


class ClientOptions(TypedDict, total=False):
    """What `PolicyClient.connect` takes besides the settings and the client id.

    The keywords of the `PolicyClient` constructor (see its Args), all optional.
    """

    jpeg_quality: int | Literal["auto"]
    trusted: TrustedServers | None
    max_chunk_steps: int
    auto_codec: AutoCodec | None
    downsize: bool
    identity: Identity | None
    known: KnownServers | None
    join: JoinToken | None


class SessionOptions(TypedDict, total=False):
    """What `PolicyClient.open_session` takes besides the replica, the features and the fps."""

    task: str
    rtc: bool
    epoch: int
    tags: dict[str, str] | None
    timeout: float
    previous: RemoteSession | None


class PlacementOptions(SessionOptions, total=False):
    """What `PolicyClient.session` takes besides the features and the fps.

    `SessionOptions`, and, when no replica is named, how `PolicyClient.connect_best` chooses one.
    """

    app: str | None
    model: str | None
    accept: Callable[[ServerInfo], bool] | None
    settle: bool
    avoid: Collection[ServerKeys]


#: The keywords of `PlacementOptions` that choose the replica.
PLACEMENT_KEYS = frozenset(PlacementOptions.__annotations__) - frozenset(SessionOptions.__annotations__)
