"""The typed keyword options of `PolicyClient.connect` and `PolicyClient.session`."""

from __future__ import annotations

import inspect
from typing import Any, Unpack, get_args, get_type_hints

import pytest

from servo.client import ClientOptions, PlacementOptions, PolicyClient, SessionOptions
from servo.client.discovery import ServerInfo
from servo.identity import ephemeral_identity
from servo.wire import Features

pytestmark = pytest.mark.anyio


def keyword_only(function: Any, *, without: tuple[str, ...] = ()) -> set[str]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in without}


def unpacked(function: Any) -> Any:
    """The TypedDict a function's ``**options`` is annotated with (``Unpack[...]``)."""
    hints = get_type_hints(function)
    (options,) = [p.name for p in inspect.signature(function).parameters.values() if p.kind is p.VAR_KEYWORD]
    assert getattr(hints[options], "__origin__", None) is Unpack
    return get_args(hints[options])[0]


def test_connect_takes_exactly_the_constructors_keywords_typed() -> None:
    assert unpacked(PolicyClient.connect) is ClientOptions
    assert set(ClientOptions.__annotations__) == keyword_only(PolicyClient.__init__)


def test_session_takes_open_sessions_and_connect_bests_keywords_typed() -> None:
    assert unpacked(PolicyClient.session.__wrapped__) is PlacementOptions  # type: ignore[attr-defined]
    assert unpacked(PolicyClient.connect_best) is SessionOptions
    assert set(SessionOptions.__annotations__) == keyword_only(PolicyClient.open_session, without=("features", "fps"))
    choosing = keyword_only(PolicyClient.connect_best, without=("features", "fps"))
    assert set(PlacementOptions.__annotations__) == choosing | set(SessionOptions.__annotations__)


async def test_a_server_and_a_keyword_that_chooses_one_is_refused_by_name() -> None:
    # Refused before anything is sent: the Zenoh session is never touched.
    client = PolicyClient(object(), "robot-1", identity=ephemeral_identity("robot"))  # type: ignore[arg-type]
    server: ServerInfo = object()  # type: ignore[assignment]
    features = Features(state_names=["a"], action_names=["a"], cameras={})
    with pytest.raises(TypeError, match=r"session\(\): app, settle choose the replica"):
        async with client.session(server, features=features, fps=30.0, app="arm", settle=False):
            pass
