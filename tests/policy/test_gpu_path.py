"""The GPU path's device-agnostic logic, run through its CPU twins (no GPU needed).

Frames onto the device (`servo.policy.frames`), CUDA graphs (`servo.policy.graphs`), the runner's
graph option and its warm-up of every batch size: each CUDA-only branch has a CPU twin that runs
the same bookkeeping, and these tests hold the twins to the host path's results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from servo.policy import PolicyLoadError
from servo.policy.frames import DeviceFrameDecoder, PinnedStager, stack_on_device
from servo.policy.graphs import GraphedCallable
from servo.policy.reference import ReferencePolicy
from servo.policy.runner import InferenceRunner, synthetic_observation
from servo.wire.image import decode_image, encode_image
from tests.policy.test_policy import ScriptedPolicy
from tests.server.policies import BatchingFixedPolicy
from tests.support import camera_frames

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

SMALL = {"front": (48, 64), "wrist": (48, 64)}


def test_frames_decoded_onto_the_device_equal_the_host_decode() -> None:
    frames = camera_frames(48, 64, seed=3)
    jpeg, raw = encode_image(frames["front"], 90), frames["wrist"]
    out = DeviceFrameDecoder("cpu").decode({"front": jpeg.data}, {"wrist": raw})
    assert out["front"].shape == (48, 64, 3)
    assert out["front"].dtype == torch.uint8
    # libjpeg-turbo on both sides: the same pixels (nvJPEG may differ by a few levels).
    np.testing.assert_array_equal(out["front"].numpy(), decode_image(jpeg))
    np.testing.assert_array_equal(out["wrist"].numpy(), raw)


def test_a_corrupt_jpeg_fails_the_device_decode() -> None:
    jpeg = bytes(encode_image(camera_frames(48, 64)["front"], 90).data)
    with pytest.raises(RuntimeError):
        DeviceFrameDecoder("cpu").decode({"front": jpeg[: len(jpeg) // 2] + bytes(64)}, {})


def test_host_and_device_frames_stack_into_the_same_tensor() -> None:
    frames = camera_frames(48, 64, seed=1)
    host = [np.frombuffer(f.tobytes(), np.uint8).reshape(f.shape) for f in frames.values()]  # read-only views
    stager = PinnedStager("cpu")
    a = stack_on_device(host, "cpu", stager)
    b = stack_on_device([torch.from_numpy(f.copy()) for f in frames.values()], "cpu")
    c = stack_on_device([host[0], torch.from_numpy(host[1].copy())], "cpu")  # mixed
    assert a.shape == (2, 48, 64, 3)
    assert torch.equal(a, b)
    assert torch.equal(a, c)
    a += 1  # the stacked tensor owns its memory: the message's bytes are untouched
    np.testing.assert_array_equal(host[0], frames["front"])


def test_the_reference_policy_gives_the_same_chunk_for_host_and_device_frames() -> None:
    policy = ReferencePolicy(cameras=SMALL)
    assert policy.spec.device_frames
    runner = InferenceRunner(policy)
    obs = synthetic_observation(policy)
    obs.images = camera_frames(48, 64, seed=7)
    host = runner.infer(policy.make_processor(), obs, 0)
    obs.images = {k: torch.from_numpy(v.copy()) for k, v in obs.images.items()}  # type: ignore[misc]
    device = runner.infer(policy.make_processor(), obs, 0)
    np.testing.assert_array_equal(host[0], device[0])


def test_a_graphed_callable_records_once_per_signature_and_replays_fresh_inputs() -> None:
    calls: list[tuple[int, ...]] = []

    def fn(x: Any, y: Any) -> Any:
        calls.append(tuple(x.shape))
        return x * 2 + y

    graphed = GraphedCallable(fn, max_graphs=2)
    for value in (1.0, 2.0, 3.0):
        out = graphed(torch.full((3,), value), torch.ones(3))
        assert torch.equal(out, torch.full((3,), value * 2 + 1))
    assert graphed.captured == 1
    first = graphed(torch.zeros(3), torch.zeros(3))
    first += 5  # a copy: the next replay is not disturbed
    assert torch.equal(graphed(torch.zeros(3), torch.zeros(3)), torch.zeros(3))
    graphed(torch.zeros(4), torch.zeros(4))
    graphed(torch.zeros(5), torch.zeros(5))  # past max_graphs: called directly, not recorded
    assert graphed.captured == 2
    assert torch.equal(graphed(torch.ones(5), torch.ones(5)), torch.full((5,), 3.0))


def test_cuda_graphs_leave_the_reference_policy_chunks_unchanged() -> None:
    plain, graphed = ReferencePolicy(cameras=SMALL), ReferencePolicy(cameras=SMALL)
    runners = InferenceRunner(plain), InferenceRunner(graphed, cuda_graphs=True)
    obs = synthetic_observation(plain)
    for seed in range(3):  # the first call records, the others replay
        obs.images = camera_frames(48, 64, seed=seed)
        obs.state = np.full(6, float(seed), np.float32)
        a, b = (r.infer(r.policy.make_processor(), obs, 0)[0] for r in runners)
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_cuda_graphs_need_a_policy_that_can_use_them() -> None:
    with pytest.raises(PolicyLoadError, match=r"model\.cuda_graphs"):
        InferenceRunner(ScriptedPolicy(np.zeros((4, 1), np.float32)), cuda_graphs=True)


def test_warmup_runs_one_forward_of_every_batch_size_served() -> None:
    policy = BatchingFixedPolicy()
    InferenceRunner(policy).warmup(2, batch_sizes=range(1, 5))
    assert [len(states) for states, _, _ in policy.batches] == [2, 3, 4]


def test_warmup_of_a_policy_that_does_not_batch_runs_single_forwards_only() -> None:
    policy = ScriptedPolicy(np.zeros((4, 1), np.float32))
    InferenceRunner(policy).warmup(2, batch_sizes=range(1, 5))
    assert len(policy.delays) == 2
