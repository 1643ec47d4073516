"""The one admission rule: robots, operators, openpi API keys, and what each may see."""

from __future__ import annotations

from servo._core import ServerIdentity
from servo.access import Access, AccessRules, ApiKey, Caller, Denied, hash_api_key
from servo.wire import fingerprint

SERVER = ServerIdentity.generate().public_key
ROBOT7 = ServerIdentity.generate().public_key
OTHER = ServerIdentity.generate().public_key
KEY = "servo-api-v1.abcdefgh.c2VjcmV0LXNlY3JldC1zZWNyZXQ"


def test_an_enrolled_name_is_its_keys_alone() -> None:
    access = Access(AccessRules(SERVER, any_robot=True, robots={"robot-7": ROBOT7}))
    assert access.robot("robot-7", ROBOT7) == Caller("robot", "robot-7", ROBOT7)
    denied = access.robot("robot-7", OTHER)
    assert isinstance(denied, Denied)
    assert fingerprint(ROBOT7) in denied.reason
    assert fingerprint(OTHER) in denied.reason
    # An open door admits a name nobody enrolled, and says nobody vouched for it.
    assert access.robot("robot-8", OTHER) == Caller("robot", "robot-8", OTHER, enrolled=False)


def test_a_closed_door_refuses_strangers_and_admits_its_own_frontends() -> None:
    access = Access(AccessRules(SERVER))
    denied = access.robot("robot-8", OTHER)
    assert isinstance(denied, Denied)
    assert "is not enrolled on this server" in denied.reason
    assert "servo-edge --join" in denied.reason
    assert access.robot("openpi-x", SERVER).kind == "server"
    access.update(robots={"robot-8": OTHER})
    assert access.robot("robot-8", OTHER) == Caller("robot", "robot-8", OTHER)


def test_api_keys_are_checked_against_their_hash_and_expiry() -> None:
    keys = {"abcdefgh": ApiKey("lab-pc", hash_api_key(KEY)), "expiredd": ApiKey("old", hash_api_key(KEY), 100.0)}
    access = Access(AccessRules(SERVER, api_keys=keys))
    assert access.api_key(f"Api-Key {KEY}") == Caller("openpi", "lab-pc", b"abcdefgh")
    for header, why in (
        (None, "an API key is required"),
        (f"Bearer {KEY}", "is not 'Api-Key <key>'"),
        (f"Api-Key {KEY}x", "not one of this server's"),
        ("Api-Key servo-api-v1.nosuchid.c2VjcmV0", "not one of this server's"),
        ("Api-Key garbage", "not one of this server's"),
        (f"Api-Key {KEY.replace('abcdefgh', 'expiredd')}", "not one of this server's"),
    ):
        denied = access.api_key(header, now=50.0)
        assert isinstance(denied, Denied)
        assert why in denied.reason, (header, denied.reason)
    expired = Access(AccessRules(SERVER, api_keys={"abcdefgh": ApiKey("old", hash_api_key(KEY), 100.0)}))
    denied = expired.api_key(f"Api-Key {KEY}", now=100.0)
    assert isinstance(denied, Denied)
    assert "has expired" in denied.reason


def test_operators_and_what_each_caller_may_see() -> None:
    access = Access(AccessRules(SERVER, operators={"dashboard": OTHER}))
    operator = access.operator(OTHER)
    assert operator == Caller("operator", "dashboard", OTHER)
    assert isinstance(access.operator(ROBOT7), Denied)
    assert operator.may_see("robot-7")
    robot = Caller("robot", "robot-7", ROBOT7)
    assert robot.may_see("robot-7")
    assert not robot.may_see("robot-8")
    assert Caller("server", "server", SERVER).may_see("robot-8")
