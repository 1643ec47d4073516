"""Who the openpi door admits, before the WebSocket upgrade: keys off loopback, budgets per client."""

from __future__ import annotations

from http import HTTPStatus

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from servo._core import ServerIdentity
from servo.access import Access, AccessRules, ApiKey, Caller, hash_api_key
from servo.frontends.openpi_gate import OpenpiGate
from servo.server.manifest import LimitsSection, OpenpiSection

KEY = "servo-api-v1.abcdefgh.c2VjcmV0LXNlY3JldC1zZWNyZXQ"


def gate(listen: str, *, opens: int = 5) -> OpenpiGate:
    limits = LimitsSection(client_opens_per_s=0.001, client_open_burst=opens)
    made = OpenpiGate(OpenpiSection(listen=listen), limits, insecure=True, any_client=False)
    made.access = Access(
        AccessRules(ServerIdentity.generate().public_key, api_keys={"abcdefgh": ApiKey("lab-pc", hash_api_key(KEY))})
    )
    return made


def upgrade(key: str | None) -> Request:
    return Request("/", Headers([] if key is None else [("Authorization", f"Api-Key {key}")]))


def test_on_loopback_no_key_is_asked() -> None:
    admitted = gate("127.0.0.1:8000").admit(upgrade(None), "127.0.0.1:5000")
    assert isinstance(admitted, Caller)
    assert admitted.kind == "openpi"


def test_off_loopback_a_key_is_needed_and_names_the_client() -> None:
    door = gate("0.0.0.0:8000")
    refused = door.admit(upgrade(None), "10.0.0.9:5000")
    assert isinstance(refused, Response)
    assert refused.status_code == HTTPStatus.UNAUTHORIZED
    assert b"an API key is required" in refused.body
    admitted = door.admit(upgrade(KEY), "10.0.0.9:5000")
    assert isinstance(admitted, Caller)
    assert admitted.name == "lab-pc"


def test_each_client_has_an_open_budget_of_its_own() -> None:
    door = gate("0.0.0.0:8000", opens=2)
    assert all(isinstance(door.admit(upgrade(KEY), "10.0.0.9:5000"), Caller) for _ in range(2))
    refused = door.admit(upgrade(KEY), "10.0.0.9:5001")
    assert isinstance(refused, Response)
    assert refused.status_code == HTTPStatus.TOO_MANY_REQUESTS
    assert b"too many connections by 'lab-pc'" in refused.body
    # Without keys the budget is the peer address's: another host is not held back.
    open_door = gate("127.0.0.1:8000", opens=1)
    assert isinstance(open_door.admit(upgrade(None), "127.0.0.1:1"), Caller)
    assert isinstance(open_door.admit(upgrade(None), "127.0.0.1:2"), Response)
    assert isinstance(open_door.admit(upgrade(None), "127.0.0.2:1"), Caller)
