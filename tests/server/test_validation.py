"""Session open: every capability mismatch is refused with a reason naming it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from servo._core import KeyPair
from servo.client import ServerInfo, SessionRejected
from servo.transport import query
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    CameraFeature,
    Features,
    Rejection,
    SessionAck,
    SessionOpen,
    decode,
    encode,
)
from tests.server.helpers import connected, metric, open_on, signed
from tests.server.policies import JOINTS, FixedComputePolicy
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

FRONT = {"front": CameraFeature(24, 32)}


def features(
    *,
    actions: list[str] | None = None,
    states: list[str] | None = None,
    cameras: dict[str, CameraFeature] | None = None,
    units: list[str] | None = None,
) -> Features:
    return Features(
        state_names=list(JOINTS) if states is None else states,
        action_names=list(JOINTS) if actions is None else actions,
        cameras=dict(FRONT) if cameras is None else cameras,
        state_units=list(units or []),
        action_units=list(units or []),
    )


@dataclass(frozen=True)
class Mismatch:
    serving: str  # extra [serving] settings
    open: dict[str, object]  # SessionOpen overrides
    code: str
    words: tuple[str, ...]  # all must appear in the reason
    policy: dict[str, object] = field(default_factory=dict)  # FixedComputePolicy options


SWAPPED = [JOINTS[1], JOINTS[0], *JOINTS[2:]]
#: An SO-100 in LeRobot's two unit conventions (use_degrees=True / False).
DEGREES = ["degrees"] * 5 + ["range_0_100"]
M100 = ["range_m100_100"] * 5 + ["range_0_100"]

MISMATCHES = {
    "action names in the wrong order": Mismatch(
        "", {"features": features(actions=SWAPPED)}, "action_names", ("order", "position 0", "'j1'", "'j0'")
    ),
    "missing action": Mismatch(
        "", {"features": features(actions=list(JOINTS[:-1]))}, "action_names", ("missing", "j5")
    ),
    "unexpected action": Mismatch(
        "", {"features": features(actions=[*JOINTS, "j6"])}, "action_names", ("unexpected", "j6")
    ),
    "state dim": Mismatch(
        "", {"features": features(states=list(JOINTS[:5]))}, "state_names", ("5 values", "expects 6")
    ),
    "missing camera": Mismatch(
        "", {"features": features(cameras={"wrist": CameraFeature(24, 32)})}, "cameras", ("front", "wrist")
    ),
    "no cameras at all": Mismatch("", {"features": features(cameras={})}, "cameras", ("front", "none")),
    "degenerate camera size": Mismatch(
        "", {"features": features(cameras={"front": CameraFeature(0, 32)})}, "bad_request", (">= 1", "height")
    ),
    "schema version": Mismatch("", {"schema_versions": [99]}, "schema_version", ("[99]", "[3]")),
    "strict fps": Mismatch("strict_fps = true", {"fps": 15.0}, "fps", ("15 fps", "30 fps")),
    "pinned task": Mismatch('default_task = "sweep"\npin_task = true', {"task": "fold"}, "task", ("'sweep'", "'fold'")),
    "-100..100 policy, degrees robot": Mismatch(
        "",
        {"features": features(units=DEGREES)},
        "units",
        ("policy acts in range -100..100", "robot uses degrees", "j0, j1, j2, j3, j4", "use_degrees=false"),
        {"units": M100},
    ),
    "degrees policy, -100..100 robot": Mismatch(
        "", {"features": features(units=M100)}, "units", ("use_degrees=true",), {"units": DEGREES}
    ),
    "degrees policy, radians ROS 2 robot": Mismatch(
        "",
        {"features": features(units=["radians"] * 6)},
        "units",
        ("policy acts in degrees but the robot uses radians", "--robot-opt units=degrees"),
        {"units": ["degrees"] * 6},
    ),
    "units for the wrong number of joints": Mismatch(
        "", {"features": features(units=DEGREES[:5])}, "units", ("5 action units", "6 action values")
    ),
}


def open_request(client_id: str, **overrides: object) -> SessionOpen:
    fields: dict[str, object] = {
        "client_id": client_id,
        "schema_versions": list(SUPPORTED_SCHEMA_VERSIONS),
        "features": features(),
        "fps": 30.0,
        "client_key": KeyPair().public_key,
    }
    fields.update(overrides)
    return SessionOpen(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", MISMATCHES.values(), ids=MISMATCHES.keys())
async def test_mismatch_is_rejected_with_its_reason(port: int, case: Mismatch) -> None:
    manifest = make_manifest(port, extra=f"[serving]\n{case.serving}\n")
    async with running_server(manifest, policy=FixedComputePolicy(**case.policy)) as (server, ready):
        async with connected(port, "robot") as client:
            if "schema_versions" in case.open or case.code == "bad_request":
                # PolicyClient always offers what it speaks, and what decodes: send the request by hand.
                replies = await query(
                    client.zsession,
                    ready.keys.client("robot").session,
                    payload=encode(open_request("robot", **case.open)),
                    timeout=2,
                )
                (reply,) = replies
                assert reply.err is not None
                rejection = decode(reply.err.payload.to_bytes(), Rejection)
            else:
                with pytest.raises(SessionRejected) as info:
                    await open_on(client, ready, **case.open)
                rejection = info.value.rejection
        assert len(server.registry) == 0
        assert metric(server, "servo_sessions_rejected_total", code=case.code) == 1
    assert rejection.code == case.code
    for word in case.words:
        assert word in rejection.reason, (word, rejection.reason)


@dataclass(frozen=True)
class Warned:
    serving: str
    open: dict[str, object]
    words: tuple[str, ...]
    check: Callable[[SessionAck], bool] = lambda ack: True


WARNINGS = {
    "non-strict fps": Warned("", {"fps": 15.0}, ("15 fps", "30 fps")),
    "rtc unsupported": Warned("", {"rtc": True}, ("does not support RTC",), lambda ack: not ack.rtc),
    "aspect ratio": Warned(
        "", {"features": features(cameras={"front": CameraFeature(24, 24)})}, ("front", "aspect ratio")
    ),
    "state names differ": Warned(
        "", {"features": features(states=[f"s{i}" for i in range(6)])}, ("state names differ",)
    ),
    "units declared by the robot only": Warned(
        "", {"features": features(units=DEGREES)}, ("action units are not declared by the policy",)
    ),
}


@pytest.mark.parametrize("case", WARNINGS.values(), ids=WARNINGS.keys())
async def test_soft_mismatch_is_accepted_with_a_warning(port: int, case: Warned) -> None:
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready, **case.open)
        assert session.ack is not None
        assert any(all(w in warning for w in case.words) for warning in session.ack.warnings), session.ack
        assert case.check(session.ack)
        assert len(server.registry) == 1
        await session.close()


async def test_clean_open_has_no_warnings_and_pins_default_task(port: int) -> None:
    manifest = make_manifest(port, extra='[serving]\ndefault_task = "sweep"\npin_task = true\n')
    async with running_server(manifest, policy=FixedComputePolicy()) as (_, ready), connected(port, "robot") as client:
        session = await open_on(client, ready, task="sweep")
        assert session.ack is not None
        assert session.ack.warnings == []
        assert session.ack.task == "sweep"
        assert session.ack.policy == ready.info
        await session.close()


async def test_garbage_session_request_is_a_bad_request(port: int) -> None:
    async with running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "robot") as client:
            for payload in (b"", b"\x93garbage", encode(open_request("bad/id"))):
                (reply,) = await query(client.zsession, ready.keys.client("robot").session, payload=payload, timeout=2)
                assert reply.err is not None
                assert decode(reply.err.payload.to_bytes(), Rejection).code == "bad_request"
        assert len(server.registry) == 0


OVERSIZED = {
    "a 5 MB session open": (b"\x00" * 5_000_000, "exceeds the limit of 65536"),
    "a task of 1025 characters": (encode(open_request("robot", task="x" * 1025)), "$.task"),
    "33 tags": (encode(open_request("robot", tags={f"k{i}": "v" for i in range(33)})), "$.tags"),
    "a tag value of 257 characters": (encode(open_request("robot", tags={"k": "v" * 257})), "$.tags"),
    "a tag key of 129 characters": (encode(open_request("robot", tags={"k" * 129: "v"})), "$.tags"),
    "a client id of 129 characters": (encode(open_request("r" * 129)), "$.client_id"),
    "5000 schema versions": (msgspec.msgpack.encode({"schema_versions": [9] * 5000}), "$.schema_versions"),
}


@pytest.mark.parametrize(("payload", "words"), OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_what_a_peer_sends_at_open_is_bounded(port: int, payload: bytes, words: str) -> None:
    """Every length a peer controls at open is capped: refused in one short line, never stored."""
    async with running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "robot") as client:
            (reply,) = await query(client.zsession, ready.keys.client("robot").session, payload=payload, timeout=5)
            assert reply.err is not None
            rejection = decode(reply.err.payload.to_bytes(), Rejection)
        assert rejection.code == "bad_request"
        assert words in rejection.reason
        assert len(rejection.reason) < 300
        assert len(server.registry) == 0


async def test_an_unsigned_or_low_order_open_is_refused_before_any_session_exists(port: int) -> None:
    """A client without a robot identity (servo before them) is told so; a signed open whose
    X25519 key is of low order (an all-zero shared secret) passes the gate, then is refused."""
    async with running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "robot") as client:
            key = ready.keys.client("robot").session
            unsigned = open_request("robot", features=ready.info.features)
            (reply,) = await query(client.zsession, key, payload=encode(unsigned), timeout=5)
            assert reply.err is not None
            rejection = decode(reply.err.payload.to_bytes(), Rejection)
            assert rejection.code == "unauthenticated"
            assert "not signed by a robot identity" in rejection.reason
            low_order = await signed(
                client, ready, open_request("robot", features=ready.info.features, client_key=bytes(32))
            )
            (reply,) = await query(client.zsession, key, payload=encode(low_order), timeout=5)
            assert reply.err is not None
            rejection = decode(reply.err.payload.to_bytes(), Rejection)
        assert rejection.code == "bad_request"
        assert "client_key" in rejection.reason
        assert len(server.registry) == 0


async def test_a_schema_1_client_is_told_which_versions_the_server_speaks(port: int) -> None:
    """Schema 1 opened sessions on <prefix>/session, with no key exchange: refused by version."""
    async with running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "robot") as client:
            v1_open = msgspec.msgpack.encode({"client_id": "robot", "schema_versions": [1], "fps": 30.0})
            (reply,) = await query(client.zsession, f"{ready.keys.prefix}/session", payload=v1_open, timeout=2)
            assert reply.err is not None
            rejection = decode(reply.err.payload.to_bytes(), Rejection)
        assert rejection.code == "schema_version"
        assert "client speaks [1], server speaks [3]" in rejection.reason
        assert metric(server, "servo_sessions_rejected_total", code="schema_version") == 1


async def test_a_schema_2_client_is_told_which_versions_the_server_speaks(port: int) -> None:
    """Schema 2 sealed bodies without encrypting them: its opens are refused by version, in one line."""
    async with running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "robot") as client:
            v2_open = msgspec.msgpack.encode({"client_id": "robot", "schema_versions": [2], "fps": 30.0})
            key = ready.keys.client("robot").session
            (reply,) = await query(client.zsession, key, payload=v2_open, timeout=2)
            assert reply.err is not None
            rejection = decode(reply.err.payload.to_bytes(), Rejection)
        assert rejection.code == "schema_version"
        assert rejection.reason == "client speaks [2], server speaks [3]"
        assert metric(server, "servo_sessions_rejected_total", code="schema_version") == 1


async def test_an_open_with_an_old_nonce_asks_the_status_again_once(port: int) -> None:
    """A status older than its nonce (a frontend's, a script's kept for minutes) costs one more
    status query, not the session; an open signed for any nonce but the replica's is refused."""
    async with running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "robot") as client:
            (found,) = [s for s in await client.discover() if s.keys == ready.keys]
            old = ServerInfo(found.keys, msgspec.structs.replace(found.status, nonce=bytes(16)))
            session = await client.open_session(old, features=ready.info.features, fps=ready.info.fps)
            assert session.server.status.nonce == found.status.nonce  # the replica's current one
            await session.close()
        assert metric(server, "servo_sessions_rejected_total", code="stale_nonce") == 1
        assert metric(server, "servo_sessions_opened_total") == 1
