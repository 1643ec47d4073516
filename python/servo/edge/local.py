"""Local engines: the policy runs in this process (the sequential and RTC modes of docs/design/control-loop.md §3).

The only edge paths allowed to import torch, and only once chosen. Both use the same
`ChunkPipeline` merge as the remote engine, and the same `InferenceRunner` as the server, so a
policy behaves the same wherever it runs.

- ``sync``: when the queue runs dry the control loop itself runs the policy and waits for the
  chunk (the robot stands still during inference).
- ``rtc``: the policy runs on a background thread while the robot keeps executing; chunks are
  merged with the same latency-aware RTC merge as remote chunks.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

import anyio

from servo._core import PUBLIC_KEY_SIZE
from servo.edge.actions import Action
from servo.edge.config import EdgeConfig
from servo.edge.engine import LOCAL_SESSION, EngineBase
from servo.edge.errors import EdgeStartError
from servo.edge.failures import PolicyFailed
from servo.edge.observation import robot_features
from servo.edge.pipeline import Produced, Request
from servo.logs import get_logger
from servo.policy import DecodedObservation, Policy, PolicyLoadError, load_policy
from servo.policy.loader import PolicyKeys
from servo.robots.protocol import RobotSpec
from servo.wire import SUPPORTED_SCHEMA_VERSIONS, Rejection, SessionOpen

if TYPE_CHECKING:
    from servo.policy.protocol import Processor
    from servo.policy.runner import InferenceRunner

log = get_logger(__name__)

#: The edge options error messages name.
EDGE_KEYS = PolicyKeys(source="policy", options="policy_options", device="device")


class LocalEngine(EngineBase):
    """Shared part of the local engines: loading, capability check, one inference.

    The policy and its processor are used by one thread at a time (the control loop for
    ``sync``, the engine's inference thread for ``rtc``).

    Args:
        config: Edge options (``[local]``: the policy; ``[pipeline]``: ``rtc``…).
        spec: The robot.
        policy: An already-built policy (tests, embedding); loaded from the config otherwise.
    """

    def __init__(self, config: EdgeConfig, spec: RobotSpec, *, policy: Policy | None = None) -> None:
        super().__init__(config, spec)
        self._policy = policy
        self._runner: InferenceRunner | None = None
        self._processor: Processor | None = None
        self._seq = 0
        #: One inference at a time, on a worker thread.
        self._limiter = anyio.CapacityLimiter(1)

    @property
    def policy(self) -> Policy | None:
        """The policy, once `load` built (or was given) it."""
        return self._policy

    def load(self) -> None:
        """Load, check and warm the policy (blocking; call off the event loop).

        Raises:
            EdgeStartError: the policy cannot be loaded, or its features do not match the robot.
        """
        from servo.policy.compatibility import describe, validate_open
        from servo.policy.runner import InferenceRunner

        try:
            local = self.config.local
            policy = self._policy or load_policy(
                local.policy, local.policy_options, device=local.device, keys=EDGE_KEYS
            )
        except PolicyLoadError as exc:
            raise EdgeStartError(str(exc), refused=True) from None
        spec = policy.spec
        info = describe(spec, serving_mode="exclusive")
        request = SessionOpen(
            client_id=self.client_id,
            schema_versions=list(SUPPORTED_SCHEMA_VERSIONS),
            features=robot_features(self.spec),
            fps=self.spec.fps,
            client_key=bytes(PUBLIC_KEY_SIZE),  # validated here, never sent: no handshake
            task=self.config.task,
            rtc=self.pipeline.rtc,
        )
        verdict = validate_open(request, info)
        if isinstance(verdict, Rejection):
            raise EdgeStartError(f"policy does not fit this robot: {verdict.reason}", refused=True)
        for warning in verdict.warnings:
            log.warning("policy warning", client_id=self.client_id, warning=warning)
        self.pipeline.set_rtc(verdict.rtc)
        self.task = verdict.task
        self.tuning = spec.tuning
        runner = InferenceRunner(policy, device=self.config.local.device)
        try:
            runner.warmup(1)
        except PolicyLoadError as exc:
            raise EdgeStartError(f"policy: {exc}", refused=True) from None
        self._policy, self._runner, self._processor = policy, runner, policy.make_processor()
        log.info("local policy ready", model=spec.model, device=self.config.local.device, rtc=self.pipeline.rtc)

    def infer(self, request: Request, *, episode_start: bool) -> Produced:
        """Run the policy for one request (blocking).

        Raises:
            PolicyFailed: the policy (or its processor) raised.
        """
        runner, processor, policy = self._runner, self._processor, self._policy
        if runner is None or processor is None or policy is None:
            raise RuntimeError("infer() called before load()")
        rtc = self.pipeline.rtc
        obs = DecodedObservation(
            state=request.obs.state,
            images=request.obs.images,
            task=request.obs.task or self.config.task,
            prefix_model=request.prefix_model if rtc else None,
            prefix_robot=request.prefix_robot if rtc else None,
        )
        self._seq += 1
        self.requests += 1
        started = time.perf_counter()
        try:
            if episode_start:
                processor.reset()
                if not policy.spec.chunk_stateless:
                    policy.reset()
            model, robot = runner.infer(processor, obs, request.delay_steps)
        except Exception as exc:  # a policy bug degrades to the fallback, then DEAD
            raise PolicyFailed(f"{type(exc).__name__}: {exc}") from exc
        return Produced(model, robot, LOCAL_SESSION, self._seq, (time.perf_counter() - started) * 1e3)

    async def start(self) -> None:
        """Load, check and warm the policy on a worker thread."""
        await anyio.to_thread.run_sync(self.load)
        await super().start()

    async def produce(self, request: Request, *, episode_start: bool) -> Produced:
        """`infer` on a worker thread while the robot keeps executing its queue."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.infer, request, episode_start=episode_start), limiter=self._limiter
        )


class RtcEngine(LocalEngine):
    """Background inference on a worker thread with the RTC merge (docs/design/control-loop.md §3).

    Chunks are merged with the same latency-aware merge as remote chunks: the engine loop of
    `EngineBase` keeps the queue fed while the robot executes it.
    """


class SyncEngine(LocalEngine):
    """Sequential mode: the control loop runs the policy whenever the queue is empty.

    Chunks are appended (no RTC): nothing executes during inference, so there is nothing to
    compensate; the price is that the robot stands still while the policy runs. The policy runs
    inside the tick, so this engine is its control loop's action source, on a thread of the
    edge's process (`servo.edge.control_loop.ThreadControlLoop`); the event loop only ticks the
    fail-safe.
    """

    runs_on_control_loop = True

    def __init__(self, config: EdgeConfig, spec: RobotSpec, *, policy: Policy | None = None) -> None:
        super().__init__(config, spec, policy=policy)
        self.pipeline.set_rtc(False)

    async def start(self) -> None:
        """Load, then append-only merging whatever the policy supports."""
        await super().start()
        self.pipeline.set_rtc(False)

    async def serve(self) -> None:
        """Idle: inference happens on the control loop (`get_action`)."""
        await anyio.sleep_forever()

    def get_action(self, now_ns: int) -> Action | None:
        """Control loop: run the policy first if the queue is dry (blocks for the inference)."""
        if (
            self._runner is not None
            and not self.paused
            and self.pipeline.queue.empty()
            and not self.failsafe.dead.is_set()
            and (obs := self.latest_observation()) is not None
            and self.pipeline.current(obs)
        ):
            # The engine loop's step, on this thread: the loop must never die of a policy bug.
            request = self.pipeline.snapshot(obs)
            try:
                produced = self.infer(request, episode_start=self.take_episode_start())
            except PolicyFailed as exc:
                self.failures.failed(exc)
            else:
                self.deliver(request, produced)
        return super().get_action(now_ns)
