"""Manifest parsing: strict, and every error names the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servo.config import ConfigError
from servo.server.manifest import load_manifest, parse_manifest
from servo.transport import DEFAULT_LOCAL_ENDPOINT

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "manifest.toml"
MODEL = '[model]\nsource = "reference"\n'


def test_minimal_manifest_has_safe_defaults() -> None:
    m = parse_manifest(MODEL)
    assert m.model.source == "reference"
    assert (m.model.device, m.model.dtype, m.model.warmup, m.model.compile) == ("cpu", "float32", 2, False)
    assert (m.serving.app, m.serving.mode, m.serving.max_sessions) == ("default", "shared", 8)
    assert not m.serving.pin_task
    assert not m.serving.strict_fps
    # loopback only, multicast off, a lease of seconds (Zenoh's own is 10 s): never exposed by accident,
    # a frozen peer noticed within seconds (a killed one when its sockets close)
    assert m.zenoh.listen == [DEFAULT_LOCAL_ENDPOINT]
    assert m.zenoh.listen[0].startswith("tcp/127.0.0.1:")
    assert not m.zenoh.multicast_scouting
    assert m.zenoh.lease_ms <= 3000
    assert m.ops.health_host == "127.0.0.1"


def test_example_manifest_parses() -> None:
    m = load_manifest(EXAMPLE)
    assert m.model.device == "cpu"
    assert m.serving.app == "demo"


def test_full_manifest_round_trips_every_section(tmp_path: Path) -> None:
    recording = tmp_path / "wave.jsonl"
    recording.write_text("")
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    m = parse_manifest(
        f"""
[model]
source = "pkg.mod:factory"
options = {{chunk_size = 20, cameras = {{front = [480, 640]}}}}
revision = "abc123"
device = "cuda:1"
dtype = "bfloat16"
warmup = 0
compile = true
[serving]
app = "fleet-a"
replica = "gpu-3"
mode = "exclusive"
max_sessions = 5
default_task = "fold the towel"
pin_task = true
strict_fps = true
max_observation_bytes = 1000000
client_grace_s = 0.5
[zenoh]
mode = "client"
connect = ["tls/router.example:7447"]
lease_ms = 500
[zenoh.tls]
root_ca_certificate = "{ca}"
[ops]
health_port = 0
audit_log = "-"
[[trajectories]]
name = "wave"
path = "{recording}"
"""
    )
    assert m.model.options == {"chunk_size": 20, "cameras": {"front": [480, 640]}}
    assert (m.model.device, m.model.dtype, m.model.compile) == ("cuda:1", "bfloat16", True)
    assert (m.serving.replica, m.serving.mode, m.serving.max_sessions) == ("gpu-3", "exclusive", 5)
    assert m.serving.pin_task
    assert m.serving.default_task == "fold the towel"
    assert m.zenoh.mode == "client"
    assert m.zenoh.connect == ["tls/router.example:7447"]
    assert m.zenoh.tls is not None
    assert m.zenoh.tls.root_ca_certificate == str(ca)
    assert m.trajectories[0].name == "wave"


ERRORS = {
    # unknown keys, at every level
    "unknown top-level section": ("[modle]\nsource = 'x'\n" + MODEL, "modle: unknown key"),
    "unknown model key": (MODEL + "devcie = 'cpu'\n", "model.devcie: unknown key"),
    "unknown serving key": (MODEL + "[serving]\nmax_session = 3\n", "serving.max_session: unknown key"),
    "unknown zenoh key": (MODEL + "[zenoh]\nlisten_endpoints = []\n", "zenoh.listen_endpoints: unknown key"),
    "unknown tls key": (MODEL + "[zenoh.tls]\nca = 'x'\n", "zenoh.tls.ca: unknown key"),
    "unknown ops key": (MODEL + "[ops]\nport = 1\n", "ops.port: unknown key"),
    "unknown trajectory key": (
        MODEL + "[[trajectories]]\nname = 'a'\npath = 'b'\nfps = 3\n",
        "trajectories[0].fps: unknown key",
    ),
    # wrong types
    "max_sessions as string": (
        MODEL + "[serving]\nmax_sessions = 'eight'\n",
        "serving.max_sessions = 'eight': expected int, got str",
    ),
    "warmup as float": (MODEL.replace("\n", "\nwarmup = 1.5\n", 1), "model.warmup = 1.5: expected int, got float"),
    "pin_task as string": (MODEL + "[serving]\npin_task = 'yes'\n", "serving.pin_task = 'yes': expected bool, got str"),
    "listen as string": (
        MODEL + "[zenoh]\nlisten = 'tcp/127.0.0.1:1'\n",
        "zenoh.listen = 'tcp/127.0.0.1:1': expected array, got str",
    ),
    "health_port as string": (
        MODEL + "[ops]\nhealth_port = '9100'\n",
        "ops.health_port = '9100': expected int, got str",
    ),
    "options not a table": (MODEL.replace("\n", "\noptions = 3\n", 1), "model.options = 3: expected object, got int"),
    "dtype not allowed": (MODEL.replace("\n", "\ndtype = 'int8'\n", 1), "model.dtype"),
    "serving mode not allowed": (MODEL + "[serving]\nmode = 'greedy'\n", "serving.mode"),
    "zenoh mode not allowed": (MODEL + "[zenoh]\nmode = 'server'\n", "zenoh.mode"),
    # missing / empty required keys
    "missing model": ("[serving]\napp = 'x'\n", "model: required key is missing"),
    "missing model source": ("[model]\ndevice = 'cpu'\n", "model.source: required key is missing"),
    "empty model source": ("[model]\nsource = ''\n", "model.source"),
    "trajectory without path": (
        MODEL + "[[trajectories]]\nname = 'a'\n",
        "trajectories[0].path: required key is missing",
    ),
    # values
    "bad device": (
        MODEL.replace("\n", "\ndevice = 'gpu0'\n", 1),
        "model.device = 'gpu0': must be cpu, cuda, cuda:N or mps",
    ),
    "negative warmup": (MODEL.replace("\n", "\nwarmup = -1\n", 1), "model.warmup = -1: expected int >= 0"),
    "app with a slash": (MODEL + "[serving]\napp = 'a/b'\n", "serving.app"),
    "app with a wildcard": (MODEL + "[serving]\napp = '*'\n", "serving.app"),
    "replica verbatim chunk": (MODEL + "[serving]\nreplica = '@x'\n", "serving.replica"),
    "zero max_sessions": (MODEL + "[serving]\nmax_sessions = 0\n", "serving.max_sessions = 0: expected int >= 1"),
    "pin without task": (MODEL + "[serving]\npin_task = true\n", "serving.pin_task = True: needs serving.default_task"),
    "negative grace": (
        MODEL + "[serving]\nclient_grace_s = -1.0\n",
        "serving.client_grace_s = -1.0: expected float >= 0.0",
    ),
    "port out of range": (MODEL + "[ops]\nhealth_port = 70000\n", "ops.health_port = 70000: expected int <= 65535"),
    "endpoint without protocol": (
        MODEL + "[zenoh]\nlisten = ['127.0.0.1:7447']\n",
        "zenoh.listen[0] = '127.0.0.1:7447': not an endpoint",
    ),
    "endpoint unknown protocol": (
        MODEL + "[zenoh]\nconnect = ['http/x:1']\n",
        "zenoh.connect[0] = 'http/x:1': not an endpoint",
    ),
    "client without connect": (MODEL + "[zenoh]\nmode = 'client'\n", "zenoh.connect"),
    "lease too short": (MODEL + "[zenoh]\nlease_ms = 10\n", "zenoh.lease_ms"),
    "missing tls file": (
        MODEL + "[zenoh.tls]\nroot_ca_certificate = '/nonexistent/ca.pem'\n",
        "zenoh.tls.root_ca_certificate",
    ),
    "missing trajectory file": (
        MODEL + "[[trajectories]]\nname = 'a'\npath = '/nonexistent/a.jsonl'\n",
        "trajectories[0].path",
    ),
    "invalid toml": ("[model\nsource = 'x'\n", "invalid TOML"),
    "unknown robot": (
        MODEL + "[robot]\ntype = 'koch'\n",
        "robot.type = 'koch': must be one of ros2, sim, so100, so101 or package.module:factory",
    ),
    "robot without type": (MODEL + "[robot]\noptions = {port = 'x'}\n", "robot.type: required key is missing"),
    # door budgets (`servo.server.signed_door`)
    "zero status rate": (
        MODEL + "[limits]\nstatus_queries_per_s = 0.0\n",
        "limits.status_queries_per_s = 0.0: expected float > 0.0",
    ),
    "zero door burst": (
        MODEL + "[limits]\ndoor_request_burst = 0\n",
        "limits.door_request_burst = 0: expected int >= 1",
    ),
    "huge status burst": (
        MODEL + "[limits]\nstatus_query_burst = 10000000\n",
        "limits.status_query_burst = 10000000: expected int <= 1000000",
    ),
    "requester burst over the door's": (
        MODEL + "[limits]\nrequester_request_burst = 700\n",
        "limits.requester_request_burst = 700: larger than door_request_burst (600): one requester could empty "
        "the door",
    ),
    "requester rate over the door's": (
        MODEL + "[limits]\ndoor_requests_per_s = 2.0\n",
        "limits.requester_requests_per_s: larger than door_requests_per_s (2): one requester could hold the door",
    ),
}


@pytest.mark.parametrize(("text", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_error_names_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_manifest(text, origin="m.toml")
    assert str(info.value).startswith("m.toml: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unreadable_manifest_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*nope\.toml.*No such file"):
        load_manifest(tmp_path / "nope.toml")


def test_zenoh_config_drops_only_after_a_real_congestion() -> None:
    """DROP publishers wait 10 ms for queue room (zenoh's 1 ms lost the first observation of
    fresh sessions on a loaded host); the manifest's zenoh section becomes the config as given."""
    m = parse_manifest(MODEL + '[zenoh]\nlisten = ["tcp/127.0.0.1:7999"]\nlease_ms = 700\n')
    conf = m.zenoh.to_config()
    drop = json.loads(conf.get_json("transport/link/tx/queue/congestion_control/drop"))
    assert drop["wait_before_drop"] == 10_000
    assert json.loads(conf.get_json("transport/link/tx/lease")) == 700
    assert json.loads(conf.get_json("listen/endpoints")) == ["tcp/127.0.0.1:7999"]
    assert json.loads(conf.get_json("scouting/multicast/enabled")) is False
