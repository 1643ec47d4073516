"""Control plane: reset (acked, encrypted, episode-aware), close, and refusals of anything unauthenticated."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
import pytest
import zenoh

from servo._core import MSG_CONTROL, MSG_CONTROL_ACK, SCHEMA_VERSION, Header, SessionKey
from servo.access import Access, AccessRules
from servo.client import RemoteSession, ServerError
from servo.server.admission import TokenBucket
from servo.server.control import MAX_CONTROL_BYTES, ControlPlane
from servo.server.joins import JoinDesk
from servo.server.manifest import LimitsSection
from servo.server.robots import RobotGate
from servo.server.state import ServerState
from servo.server.trajectories import TrajectoryLibrary
from servo.transport import query
from servo.wire import CloseRequest, ControlAck, Rejection, ResetRequest, decode, encode
from tests.server.helpers import action_tap, connected, metric, observation, open_on, sealed
from tests.server.policies import FixedComputePolicy
from tests.server.test_malformed import body
from tests.server.test_state import replica
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio


def control_message(
    session: RemoteSession, seq: int, payload: bytes, key: SessionKey | None = None
) -> tuple[bytes, bytes]:
    """``(attachment, ciphertext)`` of a control request for ``session``, encrypted with ``key`` (the
    session's by default, whose own next control request then takes a later seq_id)."""
    header = Header(SCHEMA_VERSION, MSG_CONTROL, 0, seq, session.episode_id, session.epoch, 0, session.wire_id)
    if key is None:
        session.protocol._control_seq = max(session.protocol._control_seq, seq)
    return (key or session.key).encrypt(header, payload)


async def test_reset_is_acked_and_old_episode_observations_are_dropped(port: int) -> None:
    policy = FixedComputePolicy()
    async with (
        running_server(make_manifest(port), policy=policy) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        first = await session.infer(*observation(1), timeout=5)
        assert first.episode_id == 0
        resets_before = policy.resets
        await session.reset(1)  # returns only once the server acknowledged
        assert server.registry.by_client("robot").episode_id == 1  # type: ignore[union-attr]
        async with action_tap(client.zsession, session.keys.action) as tap:
            # a straggler of episode 0 arriving after the reset is dropped, never served
            attachment, straggler = sealed(session, first.seq_id + 1, body(), episode_id=0)
            # BLOCK, as servo's own observation publisher: the straggler must arrive (exactly once).
            block = zenoh.CongestionControl.BLOCK
            client.zsession.put(session.keys.obs, straggler, attachment=attachment, congestion_control=block)
            await eventually(lambda: metric(server, "servo_observations_rejected_total", reason="stale") == 1)
            # The straggler took its seq_id: the same message again is a replay, refused as such.
            client.zsession.put(session.keys.obs, straggler, attachment=attachment, congestion_control=block)
            await eventually(lambda: metric(server, "servo_observations_rejected_total", reason="replay") == 1)
            second = await session.infer(*observation(2), timeout=5)
            assert second.episode_id == 1
            assert second.chunk_robot[0][0] == 2
            assert all(h is None or h.seq_id != 999 for h, _ in tap.seen)
        # shared mode never resets the (shared) policy itself
        assert policy.resets == resets_before
        await session.close()


async def test_reset_and_its_ack_on_the_wire_are_encrypted(port: int) -> None:
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        payload = encode(ResetRequest(session.wire_id, 4))
        attachment, ciphertext = control_message(session, 7, payload)
        assert payload not in ciphertext
        (reply,) = await query(
            client.zsession, session.keys.control, payload=ciphertext, attachment=attachment, timeout=2
        )
        assert reply.ok is not None
        assert reply.ok.attachment is not None
        sent = reply.ok.payload.to_bytes()
        header, ack_body = session.key.decrypt(reply.ok.attachment.to_bytes(), sent)
        assert ack_body not in sent
        assert (header.msg_type, header.seq_id, header.session_id) == (MSG_CONTROL_ACK, 7, session.wire_id)
        assert decode(ack_body, ControlAck) == ControlAck(session.wire_id, 4)
        await session.reset(9)  # the session's own next reset takes a later seq_id
        # the first request again is a replay: refused, nothing happens
        (reply,) = await query(
            client.zsession, session.keys.control, payload=ciphertext, attachment=attachment, timeout=2
        )
        assert reply.err is not None
        assert decode(reply.err.payload.to_bytes(), Rejection).code == "unauthenticated"
        assert metric(server, "servo_control_rejected_total", reason="replay") == 1  # refused as a replay
        (kept,) = server.registry.snapshot()
        assert kept.episode_id == 9  # the replayed request did not reset to episode 4
        await session.close()


async def test_unauthenticated_resets_and_closes_change_nothing(port: int) -> None:
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        close = encode(CloseRequest(session.wire_id))
        forged_key = SessionKey(bytes(32), role="client")
        attempts = {
            "header": (None, close),  # no attachment at all
            "mac": control_message(session, 50, close, key=forged_key),  # the right session id, a guessed key
        }
        for reason, (attachment, payload) in attempts.items():
            (reply,) = await query(
                client.zsession, session.keys.control, payload=payload, attachment=attachment, timeout=2
            )
            assert reply.err is not None
            assert decode(reply.err.payload.to_bytes(), Rejection).code == "unauthenticated"
            assert metric(server, "servo_control_rejected_total", reason=reason) == 1
        assert len(server.registry) == 1
        result = await session.infer(*observation(3), timeout=5)
        assert result.chunk_robot[0][0] == 3
        await session.close()


async def test_close_frees_capacity_and_unknown_sessions_are_refused(port: int) -> None:
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 1\n")
    async with (
        running_server(manifest, policy=FixedComputePolicy()) as (server, ready),
        connected(port, "a") as ca,
        connected(port, "b") as cb,
    ):
        sa = await open_on(ca, ready)
        await sa.infer(*observation(1), timeout=5)
        stale_id = sa.session_id
        await sa.close()
        assert len(server.registry) == 0
        assert metric(server, "servo_sessions_collected_total", reason="closed") == 1
        sb = await open_on(cb, ready)  # the slot is free again
        await sb.infer(*observation(2), timeout=5)
        # a sealed reset of a session that no longer exists: refused, named
        with pytest.raises(ServerError) as info:
            await sa.reset(1)
        assert info.value.code == "unknown_session"
        assert stale_id in info.value.message
        # b's session id on a's key: a has no session there, so nothing to authenticate against
        attachment, reset_b = control_message(sb, 99, encode(ResetRequest(sb.wire_id, 1)))
        (reply,) = await query(ca.zsession, sa.keys.control, payload=reset_b, attachment=attachment, timeout=2)
        assert reply.err is not None
        assert decode(reply.err.payload.to_bytes(), Rejection).code == "unknown_session"
        assert server.registry.get(sb.session_id) is not None
        result = await sb.infer(*observation(3), timeout=5)
        assert result.episode_id == 0
        await sb.close()


def test_session_opens_are_rate_limited_by_a_token_bucket() -> None:
    """Opens are handshakes anybody may ask for: a burst passes, a flood is refused until it refills."""
    now = [0.0]
    budget = TokenBucket(10.0, 5, clock=lambda: now[0])
    assert [budget.take() for _ in range(7)] == [True] * 5 + [False] * 2
    now[0] = 0.25  # 2.5 tokens back
    assert [budget.take() for _ in range(3)] == [True, True, False]
    now[0] = 100.0  # never more than the burst
    assert sum(budget.take() for _ in range(10)) == 5


async def test_an_oversized_trajectory_request_is_refused_by_size(port: int) -> None:
    """The trajectory queryable is public: its request is bounded like every control request."""
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (_, ready),
        connected(port, "robot") as client,
    ):
        (reply,) = await query(client.zsession, ready.keys.trajectory, payload=b"\x00" * 70_000, timeout=2)
        assert reply.err is not None
        rejection = decode(reply.err.payload.to_bytes(), Rejection)
        assert rejection.code == "bad_request"
        assert "exceeds the limit of 65536" in rejection.reason


async def test_an_oversized_control_request_is_refused_by_size_and_changes_nothing(port: int) -> None:
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        padded = encode(ResetRequest(session.wire_id, 5)) + bytes(MAX_CONTROL_BYTES)
        attachment, ciphertext = control_message(session, 7, padded)  # the right key: refused for its size
        (reply,) = await query(
            client.zsession, session.keys.control, payload=ciphertext, attachment=attachment, timeout=2
        )
        assert reply.err is not None
        rejection = decode(reply.err.payload.to_bytes(), Rejection)
        assert rejection.code == "bad_request"
        assert f"control request of {len(padded)} bytes exceeds the limit of {MAX_CONTROL_BYTES}" in rejection.reason
        assert metric(server, "servo_control_rejected_total", reason="too_large") == 1
        assert server.registry.by_client("robot").episode_id == 0  # type: ignore[union-attr]
        assert server.registry.by_client("robot").auth.last_control_seq == 0  # type: ignore[union-attr]  # no seq taken
        attachment, reset = control_message(session, 8, encode(ResetRequest(session.wire_id, 5)))
        (reply,) = await query(client.zsession, session.keys.control, payload=reset, attachment=attachment, timeout=2)
        assert reply.ok is not None
        assert server.registry.by_client("robot").episode_id == 5  # type: ignore[union-attr]
        await session.close()


class Uncopyable:
    """A payload still in Zenoh, larger than any control request may be; copying it fails the test."""

    def __len__(self) -> int:
        return MAX_CONTROL_BYTES + 1

    def to_bytes(self) -> bytes:
        raise AssertionError("an oversized control request was copied out of Zenoh")


@dataclass
class FakeQuery:
    """What `ControlPlane.answer` reads of a query, recording the replies."""

    key_expr: str
    payload: Uncopyable = field(default_factory=Uncopyable)
    attachment: None = None
    errors: list[Rejection] = field(default_factory=list)
    dropped: bool = False

    def reply(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("an oversized control request was answered with a result")

    def reply_err(self, payload: bytes) -> None:
        self.errors.append(decode(payload, Rejection))

    def drop(self) -> None:
        self.dropped = True


def open_gate(state: ServerState) -> RobotGate:
    """The gate of a loopback server that enrols nobody: any robot may come."""
    access = Access(AccessRules(server=state.replica.identity.public_key, any_robot=True))
    return RobotGate(access, JoinDesk(None, access, {}), LimitsSection(), state.returning)


async def test_control_queries_are_bounded_before_their_payload_is_copied() -> None:
    """A hostile peer cannot make the event loop copy Zenoh's largest message: the size comes first."""
    state = ServerState(client_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        state.bind(replica(), tg)
        state.start_serving()
        plane = ControlPlane(
            state,
            policy=FixedComputePolicy(),
            zsession=None,  # type: ignore[arg-type]  # nothing gets far enough to declare
            trajectories=TrajectoryLibrary({}),
            robots=open_gate(state),
            takeover_idle_s=1.0,
            limits=LimitsSection(),
            max_observation_bytes=1 << 20,
        )
        keys = state.replica.keys
        for handler, key in (
            (plane.open, keys.client("robot").session),
            (plane.open_legacy, f"{keys.prefix}/session"),
            (plane.trajectory, keys.trajectory),
        ):
            q = FakeQuery(key)
            plane.answer(handler, q, None)  # type: ignore[arg-type]
            assert q.dropped
            (rejection,) = q.errors
            expected = "schema_version" if handler == plane.open_legacy else "bad_request"
            assert rejection.code == expected, (handler, rejection)
            if handler != plane.open_legacy:
                assert f"exceeds the limit of {MAX_CONTROL_BYTES}" in rejection.reason, rejection
        assert len(state.registry) == 0
        tg.cancel_scope.cancel()
