"""``device`` is honoured end to end: the factory builds on it, and a policy whose weights end up
elsewhere is refused. On a CPU-only machine the "other device" is torch's ``meta`` device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from servo.config import ConfigError
from servo.edge.config import load_edge_config
from servo.edge.local import RtcEngine
from servo.edge.remote import EdgeStartError
from servo.policy import DecodedObservation, PolicyLoadError, Prepared, load_policy
from servo.policy.device import torch_modules
from servo.policy.protocol import PolicySpec
from servo.robots import make_robot
from servo.server.manifest import parse_manifest
from servo.wire import Features

CAMERAS = {"front": (48, 64)}
#: The simulated arm's joints, so a probe fits it.
JOINTS = list(make_robot("sim", {"cameras": "none"}).spec.joint_names)


class _Identity:
    def preprocess(self, obs: DecodedObservation) -> Prepared:
        return Prepared(obs.state, None)

    def postprocess(self, chunk: np.ndarray) -> np.ndarray:
        return chunk

    def reset(self) -> None:
        pass


class DeviceProbe:
    """A policy holding a torch module on whatever device it was built with; numpy forward."""

    def __init__(self, device: str, *, obey: bool = True) -> None:
        self.built_on = device
        self.net = torch.nn.Linear(2, 2, device=device if obey else "cpu")
        self._spec = PolicySpec("probe", "1", Features(JOINTS, JOINTS, {}), 4, 30.0, True, True)

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def make_processor(self) -> _Identity:
        return _Identity()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        return np.zeros((4, len(JOINTS)), np.float32)

    def reset(self) -> None:
        pass


def make_probe(device: str) -> DeviceProbe:
    return DeviceProbe(device)


def make_disobedient(device: str) -> DeviceProbe:
    return DeviceProbe(device, obey=False)


def make_without_device_argument() -> DeviceProbe:
    return DeviceProbe("cpu")


def placement(policy: Any) -> set[str]:
    return {p.device.type for _, module in torch_modules(policy) for p in module.parameters()}


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_reference_policy_weights_are_on_the_requested_device(device: str) -> None:
    policy = load_policy("reference", {"cameras": CAMERAS}, device=device)
    assert placement(policy) == {device}


def test_own_factories_receive_the_device() -> None:
    policy = load_policy("tests.policy.test_device:make_probe", device="meta")
    assert isinstance(policy, DeviceProbe)
    assert policy.built_on == "meta"
    assert placement(policy) == {"meta"}


def test_a_factory_that_ignores_the_device_is_refused() -> None:
    with pytest.raises(PolicyLoadError) as info:
        load_policy("tests.policy.test_device:make_disobedient", device="meta")
    assert str(info.value) == (
        "model.device: 'meta' requested, but the policy's net has weights on cpu "
        "(does its factory build its modules on the `device` it is given?)"
    )
    # a factory without a device argument gets none, and is refused the same way off the CPU
    with pytest.raises(PolicyLoadError, match="has weights on cpu"):
        load_policy("tests.policy.test_device:make_without_device_argument", device="meta")
    assert placement(load_policy("tests.policy.test_device:make_without_device_argument")) == {"cpu"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_device_is_one_line() -> None:
    with pytest.raises(PolicyLoadError, match=r"^model.device: 'cuda' requested but torch sees no CUDA device"):
        load_policy("reference", {"cameras": CAMERAS}, device="cuda")
    with pytest.raises(PolicyLoadError, match=r"^model.device: 'tpu' is not a torch device"):
        load_policy("reference", device="tpu")
    if not torch.backends.mps.is_available():
        with pytest.raises(PolicyLoadError, match="MPS"):
            load_policy("reference", device="mps")


def test_device_is_not_a_factory_option() -> None:
    with pytest.raises(PolicyLoadError, match=r"model\.options\.device: set the device with model\.device"):
        load_policy("reference", {"device": "cpu"})


def test_manifest_device_reaches_the_factory() -> None:
    manifest = parse_manifest('[model]\nsource = "tests.policy.test_device:make_probe"\ndevice = "cpu"\n')
    policy = load_policy(manifest.model.source, manifest.model.options, device=manifest.model.device)
    assert isinstance(policy, DeviceProbe)
    assert policy.built_on == "cpu"
    with pytest.raises(ConfigError, match=r"model\.device = 'gpu': must be cpu, cuda, cuda:N or mps"):
        parse_manifest('[model]\nsource = "reference"\ndevice = "gpu"\n')


def test_edge_local_engine_builds_the_policy_on_its_device() -> None:
    robot = make_robot("sim", {"cameras": "none", "realtime": "false"})
    config = load_edge_config(
        flags={"inference": "rtc", "policy": "tests.policy.test_device:make_probe", "device": "meta"}
    )
    engine = RtcEngine(config, robot.spec)
    engine.load()
    assert isinstance(engine.policy, DeviceProbe)
    assert engine.policy.built_on == "meta"
    assert placement(engine.policy) == {"meta"}
    refused = load_edge_config(
        flags={"inference": "rtc", "policy": "tests.policy.test_device:make_disobedient", "device": "meta"}
    )
    with pytest.raises(EdgeStartError, match=r"^device: 'meta' requested, but the policy's net has weights on cpu"):
        RtcEngine(refused, robot.spec).load()
