"""What the monitor believes: only records of robots the fleet enrolled, signed by their key, readable
with its identity, never a replay; times on its own clock; replicas from verified status and
tokens; events, robots and series bounded."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from servo._core import ServerIdentity
from servo.monitor import FleetView, RobotTrust, TrustError, load_pins
from servo.monitor.exporter import FleetExporter
from servo.monitor.fleet import CHECK_BURST_PER_ROBOT, FLEET_EVENTS
from servo.wire import EdgeTelemetry, Features, PolicyInfo, StatusReply, Transition, fingerprint, seal_telemetry
from servo.wire import telemetry_key as key

ROBOT = ServerIdentity.from_seed(bytes(range(32)))
OTHER = ServerIdentity.from_seed(bytes(32))
#: The monitor's own identity: robots encrypt their records to it.
MONITOR = ServerIdentity.from_seed(bytes(range(3, 35)))


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 100.0, 1_800_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def view(
    clocks: Clocks,
    pins: dict[str, bytes] | None = None,
    *,
    max_robots: int = 4096,
    first_use: bool = False,
    state: Path | None = None,
) -> FleetView:
    pins = {"robot-7": ROBOT.public_key} if pins is None else pins
    trust = RobotTrust(pins, max_robots=max_robots, trust_first_use=first_use, state=state)
    return FleetView(trust, MONITOR, clock=lambda: clocks.mono, wall=lambda: clocks.wall)


def record(seq: int, *, run: int = 1, robot: str = "robot-7", **changes: object) -> EdgeTelemetry:
    base = EdgeTelemetry(robot, run, seq, 1000.0, "streaming", replica="r0")
    return msgspec.structs.replace(base, **changes)


def sealed(rec: EdgeTelemetry, signer: ServerIdentity = ROBOT) -> tuple[bytes, bytes]:
    return seal_telemetry(rec, signer, [MONITOR.public_key])


def feed(fleet: FleetView, rec: EdgeTelemetry, signer: ServerIdentity = ROBOT) -> None:
    fleet.on_telemetry(key(rec.client_id), *sealed(rec, signer))


def test_an_enrolled_robots_key_alone_may_sign(clocks: Clocks) -> None:
    fleet = view(clocks)
    feed(fleet, record(0), signer=OTHER)  # a stranger speaking first, as robot-7
    assert fleet.robots == {}
    feed(fleet, record(1))
    feed(fleet, record(2, state="degraded"), signer=OTHER)
    robot = fleet.snapshot()["robots"][0]
    assert (robot["state"], robot["identity_changed"], robot["pinned"]) == ("streaming", True, True)
    assert robot["fingerprint"] == fingerprint(ROBOT.public_key)
    assert fleet.refused == {"identity_changed": 2}


def test_the_first_speaker_takes_over_no_robot(clocks: Clocks) -> None:
    """Issue 29: the monitor trusted a robot's key on first use, in memory: an attacker that reported
    robot-7 first was shown for the whole run and the real robot's records were refused."""
    fleet = view(clocks, pins={})
    feed(fleet, record(0, state="dead"), signer=OTHER)  # nobody enrolled robot-7 yet: not believed
    assert fleet.robots == {}
    fleet.trust.learn_roster({"robot-7": ROBOT.public_key})  # a trusted replica's signed roster
    feed(fleet, record(1))
    feed(fleet, record(2, state="dead"), signer=OTHER)
    assert fleet.snapshot()["robots"][0]["state"] == "streaming"
    assert fleet.refused == {"unknown_robot": 1, "identity_changed": 1}


def test_first_use_only_when_asked(clocks: Clocks) -> None:
    fleet = view(clocks, pins={}, first_use=True)
    feed(fleet, record(0))
    feed(fleet, record(1, state="dead"), signer=OTHER)
    robot = fleet.snapshot()["robots"][0]
    assert (robot["state"], robot["pinned"], robot["identity_changed"]) == ("streaming", False, True)


def test_replays_and_forgeries_are_refused(clocks: Clocks) -> None:
    fleet = view(clocks)
    feed(fleet, record(5))
    feed(fleet, record(5, state="dead"))  # the same seq again
    feed(fleet, record(3, state="dead"))  # an older one
    feed(fleet, record(0, run=2, state="connecting"))  # the robot restarted: a new run
    feed(fleet, record(9, state="dead"))  # the superseded run never comes back
    body, attachment = sealed(record(10, run=2, state="dead"))
    fleet.on_telemetry(key("robot-7"), body[:-1] + b"\x00", attachment)  # tampered
    fleet.on_telemetry(key("robot-7"), body, None)  # unsigned
    other_reader = seal_telemetry(record(11, run=2), ROBOT, [OTHER.public_key])
    fleet.on_telemetry(key("robot-7"), *other_reader)  # not encrypted to this monitor
    assert fleet.robots["robot-7"].record.state == "connecting"
    assert fleet.refused == {"replay": 3, "signature": 1, "malformed": 1, "unreadable": 1}


def test_a_replayed_old_run_is_refused_after_a_restart(clocks: Clocks, tmp_path: Path) -> None:
    """Issue 29: replayed records of a run the monitor never saw were accepted (its state was memory)."""
    state = tmp_path / "monitor.state"
    old_run = [sealed(record(seq, run=4)) for seq in range(3)]  # captured while the monitor was away
    fleet = view(clocks, state=state)
    feed(fleet, record(0, run=5))
    fleet.trust.save()
    restarted = view(clocks, state=state)  # a new monitor process, the same state file
    for sample in old_run:
        restarted.on_telemetry(key("robot-7"), *sample)
    assert restarted.robots == {}
    assert restarted.refused == {"replay": 3}
    feed(restarted, record(1, run=5))
    assert restarted.robots["robot-7"].record.seq == 1
    state.write_text("{not json")
    with pytest.raises(TrustError, match="not a monitor state file"):
        view(clocks, state=state)


def test_invented_names_take_no_place_and_no_series(clocks: Clocks) -> None:
    """Issue 29: 4,200 invented robot names made the monitor track 4,096 robots, grow /metrics from
    9 kB to 6.7 MB and hide a real robot that started later."""
    fleet = view(clocks)
    before = len(FleetExporter(fleet).render())
    for i in range(4200):
        feed(fleet, record(0, robot=f"ghost-{i}"), signer=ServerIdentity.from_seed(i.to_bytes(32, "little")))
    feed(fleet, record(0))  # the real robot, starting later
    assert sorted(fleet.robots) == ["robot-7"]
    assert fleet.refused == {"unknown_robot": 4200}
    exported = FleetExporter(fleet).render()
    assert len(exported) < before + 8_000  # one robot's series, and the refusal counter
    assert b"ghost" not in exported


def test_first_use_is_bounded_and_enrolled_robots_always_have_a_place(clocks: Clocks) -> None:
    fleet = view(clocks, first_use=True, max_robots=2)
    for i in range(5):
        feed(fleet, record(0, robot=f"robot-{i}"), signer=ServerIdentity.from_seed(bytes([i]) * 32))
    feed(fleet, record(0))
    assert sorted(fleet.robots) == ["robot-0", "robot-1", "robot-7"]
    assert fleet.refused == {"too_many_robots": 3}


def test_transitions_are_placed_on_the_monitors_clock_and_staleness_follows_the_period(clocks: Clocks) -> None:
    fleet = view(clocks)
    feed(fleet, record(0, period_ms=500.0, transitions=[Transition("streaming", "chunk merged", 250.0)]))
    (at, state, reason) = fleet.robots["robot-7"].transitions[0]
    assert (at, state, reason) == (clocks.wall - 0.25, "streaming", "chunk merged")
    assert fleet.snapshot()["robots"][0]["stale"] is False
    clocks.advance(2.9)
    assert fleet.snapshot()["robots"][0]["stale"] is False  # at least 3 s
    clocks.advance(0.2)
    assert fleet.snapshot()["robots"][0]["stale"] is True
    events = fleet.snapshot()["events"]
    assert [e["kind"] for e in events] == ["join", "transition"]  # newest first: it happened before the record


def test_edge_rejections_become_events(clocks: Clocks) -> None:
    fleet = view(clocks)
    feed(fleet, record(0, chunks_rejected={"mac": 1}))
    feed(fleet, record(1, chunks_rejected={"mac": 3}))
    feed(fleet, record(2, chunks_rejected={"mac": 3}))
    texts = [e["text"] for e in fleet.snapshot()["events"] if e["kind"] == "refusal"]
    assert texts == ["edge rejected 2 chunk(s): mac"]


def test_refusal_events_are_throttled_and_the_events_bounded(clocks: Clocks) -> None:
    fleet = view(clocks)
    for seq in range(3 * FLEET_EVENTS):
        fleet.on_telemetry(key(f"ghost-{seq % 3}"), b"x", None)
    assert fleet.refused == {"malformed": 3 * FLEET_EVENTS}
    assert len([e for e in fleet.events if e["kind"] == "refusal"]) == 3  # once per robot and reason per 10 s
    for seq in range(2 * FLEET_EVENTS):
        clocks.advance(0.1)  # within the robot's check budget
        feed(fleet, record(seq, transitions=[Transition("streaming", f"x{seq}", 1.0)]))
    assert len(fleet.events) == FLEET_EVENTS


def test_a_robot_flapping_between_two_states_makes_two_events_with_counts(clocks: Clocks) -> None:
    fleet = view(clocks)
    for seq in range(40):
        clocks.advance(1.0)
        state, reason = ("degraded", "request outstanding too long") if seq % 2 else ("streaming", "chunk merged")
        feed(fleet, record(seq, state=state, transitions=[Transition(state, reason, 0.0)]))
    events = fleet.snapshot()["events"]
    assert [(e["kind"], e["count"]) for e in events] == [("transition", 20), ("transition", 20), ("join", 1)]
    assert events[0]["text"] == "degraded: request outstanding too long"  # the newest first
    assert events[0]["t"] == clocks.wall
    assert events[1]["first"] == clocks.wall - 39
    clocks.advance(200.0)  # long after: a new event, not more of the old one
    feed(fleet, record(40, transitions=[Transition("streaming", "chunk merged", 0.0)]))
    assert [e["count"] for e in fleet.snapshot()["events"][:2]] == [1, 20]


def test_stopped_stale_and_crashed_robots_are_told_apart(clocks: Clocks) -> None:
    fleet = view(clocks, dict.fromkeys(("robot-7", "robot-8"), ROBOT.public_key))
    feed(fleet, record(0, transitions=[Transition("streaming", "chunk merged", 0.0)]))
    feed(fleet, record(0, robot="robot-8", transitions=[Transition("streaming", "chunk merged", 0.0)]))
    clocks.advance(1.0)
    feed(fleet, record(1, robot="robot-8", goodbye="signal"))  # Ctrl-C: its last record says goodbye
    statuses = lambda: {r["id"]: r["status"] for r in fleet.snapshot()["robots"]}  # noqa: E731
    assert statuses() == {"robot-7": "streaming", "robot-8": "stopped"}
    clocks.advance(4.0)
    assert statuses() == {"robot-7": "stale", "robot-8": "stopped"}
    clocks.advance(10.0)
    assert statuses() == {"robot-7": "crashed", "robot-8": "stopped"}
    assert "robot-8: stopped: signal (last state streaming)" in [
        f"{e['robot']}: {e['text']}" for e in fleet.snapshot()["events"]
    ]
    # The timelines end in that state, from when it began, whatever the last record said.
    crashed = fleet.timeline("robot-7")
    assert crashed is not None
    assert [(t["state"], t["t"]) for t in crashed["transitions"]] == [
        ("streaming", clocks.wall - 15.0),
        ("stale", clocks.wall - 15.0 + 3.0),
        ("crashed", clocks.wall - 15.0 + 10.0),
    ]
    stopped = fleet.timeline("robot-8")
    assert stopped is not None
    assert stopped["transitions"][-1] == {"t": clocks.wall - 14.0, "state": "stopped", "reason": "signal"}


def test_a_monitor_that_joins_late_draws_the_state_of_the_newest_record(clocks: Clocks) -> None:
    fleet = view(clocks)
    last = Transition("stalled", "no fresh action for the control loop", 121_000.0)
    feed(fleet, record(57, state="stalled", last_transition=last))  # no transitions since its previous record
    timeline = fleet.timeline("robot-7")
    assert timeline is not None
    assert timeline["transitions"] == [
        {"t": clocks.wall - 121.0, "state": "stalled", "reason": "no fresh action for the control loop"}
    ]


def test_the_fleet_round_trip_over_time(clocks: Clocks) -> None:
    fleet = view(clocks, dict.fromkeys("abc", ROBOT.public_key))
    clocks.wall = 1_800_000_000.0  # a bucket's start
    for robot, p50 in (("a", 10.0), ("b", 20.0), ("c", 60.0)):
        feed(fleet, record(0, robot=robot, rtt_ms_p50=p50, rtt_ms_p99=p50 * 2))
    clocks.advance(5.0)
    feed(fleet, record(1, robot="a", rtt_ms_p50=11.0, rtt_ms_p99=15.0))
    assert fleet.snapshot()["rtt"] == [
        {"t": 1_800_000_000.0, "p50": 20.0, "p99": 120.0, "robots": 3},
        {"t": 1_800_000_005.0, "p50": 11.0, "p99": 15.0, "robots": 1},
    ]


def status(replica: str, *, draining: bool = False) -> StatusReply:
    features = Features(["a"], ["a"], {})
    info = PolicyInfo("m", "rev", features, 10, 30.0, True, True, "shared")
    return StatusReply("s", "app", "m", replica, [3], info, True, draining, 2, 8, 0.25, bytes(32), 1.5)


def test_replicas_follow_status_and_tokens(clocks: Clocks) -> None:
    fleet = view(clocks)
    prefix = "@servo/app/m/r0"
    fleet.on_replica_token("@servo/app/m/0-evil", True)  # a token alone shows no replica
    assert fleet.snapshot()["replicas"] == []
    fleet.on_replica_token(prefix, True)
    fleet.on_status(prefix, status("r0"))  # verified by the collector (tests/monitor/test_collector.py)
    (replica,) = fleet.snapshot()["replicas"]
    assert (replica["up"], replica["sessions"], replica["revision"], replica["draining"]) == (True, 2, "rev", False)
    fleet.on_status(prefix, status("r0", draining=True))
    fleet.on_replica_token(prefix, False)
    (replica,) = fleet.snapshot()["replicas"]
    # Down: no live figures (its last status is history), but what it serves is still known.
    assert (replica["up"], replica["draining"], replica["sessions"], replica["load"], replica["queue_wait_ms"]) == (
        False,
        False,
        None,
        None,
        None,
    )
    assert (replica["revision"], replica["down_s"]) == ("rev", 0.0)
    assert [e["text"] for e in fleet.snapshot()["events"]] == ["down (liveliness token gone)", "draining", "up"]
    exported = FleetExporter(fleet).render().decode()
    assert 'servo_fleet_replica_up{app="app",model="m",replica="r0"} 0.0' in exported
    clocks.advance(301)
    fleet.prune()
    assert fleet.snapshot()["replicas"] == []


def test_the_exporter_gives_every_robot_its_series(clocks: Clocks) -> None:
    fleet = view(clocks)
    feed(fleet, record(0, fallback_ticks=7, rtt_ms_p50=12.5, chunks_rejected={"mac": 2}, codec="jpeg90"))
    text = FleetExporter(fleet).render().decode()
    for line in (
        'servo_edge_state{robot="robot-7",state="streaming"} 1.0',
        'servo_edge_state{robot="robot-7",state="dead"} 0.0',
        'servo_edge_fallback_ticks_total{robot="robot-7"} 7.0',
        'servo_edge_rtt_ms{quantile="0.5",robot="robot-7"} 12.5',
        'servo_edge_chunks_rejected_total{reason="mac",robot="robot-7"} 2.0',
        'servo_edge_info{codec="jpeg90",model="",replica="r0",robot="robot-7"} 1.0',
        'servo_edge_up{robot="robot-7"} 1.0',
    ):
        assert line in text, line


def test_pins_file(tmp_path: Path) -> None:
    pins = tmp_path / "keys"
    pins.write_text(f"# fleet\n\nrobot-7 {fingerprint(ROBOT.public_key)}  # arm 7\n")
    assert load_pins(pins) == {"robot-7": ROBOT.public_key}
    pins.write_text("robot-7 ed25519:nope\n")
    with pytest.raises(TrustError, match="line 1"):
        load_pins(pins)
    pins.write_text(f"robot/7 {fingerprint(ROBOT.public_key)}\n")
    with pytest.raises(TrustError, match="robot id"):
        load_pins(pins)
    with pytest.raises(TrustError, match="cannot read"):
        load_pins(tmp_path / "missing")


def test_a_forger_under_a_robots_name_makes_the_monitor_check_a_bounded_number(clocks: Clocks) -> None:
    """Review of issue 29: every forged record under an enrolled name cost a signature check."""
    fleet = view(clocks)
    body, attachment = sealed(record(1))
    for _ in range(CHECK_BURST_PER_ROBOT * 5):  # all at one instant
        fleet.on_telemetry(key("robot-7"), body[:-1] + b"\x00", attachment)
    assert fleet.refused["signature"] == CHECK_BURST_PER_ROBOT
    assert fleet.refused["rate"] == CHECK_BURST_PER_ROBOT * 4
    clocks.advance(1.0)  # the robot's next record, a period later
    feed(fleet, record(2))
    assert fleet.robots["robot-7"].record.seq == 2
