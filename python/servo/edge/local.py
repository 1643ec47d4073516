"""Local engines: the policy runs in this process (seeds/004's Sequential and RTC modes).

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
from anyio.abc import TaskStatus

from servo._core import PUBLIC_KEY_SIZE
from servo.edge.actions import Action
from servo.edge.config import EdgeConfig
from servo.edge.engine import LOCAL_SESSION, EngineBase, Produced, robot_features
from servo.edge.errors import EdgeStartError
from servo.edge.pipeline import Request
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
#: Consecutive policy failures after which a local engine gives up (DEAD).
MAX_FAILURES_IN_ROW = 3


class LocalEngine(EngineBase):
    """Shared part of the local engines: loading, capability check, one inference.

    The policy and its processor are used by one thread at a time (the control loop for
    ``sync``, the engine's inference thread for ``rtc``).

    Args:
        config: Edge options (``policy``, ``policy_options``, ``device``, ``rtc``…).
        spec: The robot.
        policy: An already-built policy (tests, embedding); loaded from the config otherwise.
    """

    def __init__(self, config: EdgeConfig, spec: RobotSpec, *, policy: Policy | None = None) -> None:
        super().__init__(config, spec)
        self.client_id = config.client_id or f"{spec.name}-local"
        self._policy = policy
        self._runner: InferenceRunner | None = None
        self._processor: Processor | None = None
        self._seq = 0
        self._failures_in_row = 0

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
        runner = InferenceRunner(policy, device=self.config.local.device)
        try:
            runner.warmup(1)
        except PolicyLoadError as exc:
            raise EdgeStartError(f"policy: {exc}", refused=True) from None
        self._policy, self._runner, self._processor = policy, runner, policy.make_processor()
        log.info("local policy ready", model=spec.model, device=self.config.local.device, rtc=self.pipeline.rtc)

    def infer(self, request: Request, *, episode_start: bool) -> Produced:
        """Run the policy for one request (blocking)."""
        runner, processor, policy = self._runner, self._processor, self._policy
        if runner is None or processor is None or policy is None:
            raise RuntimeError("infer() called before load()")
        if episode_start:
            processor.reset()
            if not policy.spec.chunk_stateless:
                policy.reset()
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
        model, robot = runner.infer(processor, obs, request.delay_steps)
        return Produced(model, robot, LOCAL_SESSION, self._seq, (time.perf_counter() - started) * 1e3)

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self._failures_in_row += 1
        log.exception("local inference failed", client_id=self.client_id, exc_info=exc)
        if self._failures_in_row >= MAX_FAILURES_IN_ROW:
            self.failsafe.fatal(f"policy failed {self._failures_in_row} times in a row: {exc}")

    async def _prepare(self) -> None:
        await anyio.to_thread.run_sync(self.load)
        self.attach_loop()
        self.failsafe.session_opened()


class RtcEngine(LocalEngine):
    """Background inference on a worker thread with the RTC merge (seeds/004 RTC mode)."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Load, then keep the queue above ``buffer_time_s`` until cancelled."""
        await self._prepare()
        limiter = anyio.CapacityLimiter(1)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.tick_failsafe)
                task_status.started()
                while not self.failsafe.dead.is_set():
                    obs = await self.wait_until_needed()
                    request = self.pipeline.snapshot(obs)
                    start = self.take_episode_start()
                    try:
                        produced = await anyio.to_thread.run_sync(
                            functools.partial(self.infer, request, episode_start=start), limiter=limiter
                        )
                    except Exception as exc:  # a policy bug degrades to the fallback, then DEAD
                        self._failed(exc)
                        continue
                    self._failures_in_row = 0
                    self.merge(request, produced, time.monotonic_ns())
                tg.cancel_scope.cancel()
        finally:
            self.detach_loop()


class SyncEngine(LocalEngine):
    """Sequential mode: the control loop runs the policy whenever the queue is empty.

    Chunks are appended (no RTC): nothing executes during inference, so there is nothing to
    compensate; the price is that the robot stands still while the policy runs. The policy runs
    inside the tick, so this engine is its control loop's action source, on a thread of the
    edge's process (`servo.edge.control_loop.ThreadControlLoop`).
    """

    runs_on_control_loop = True

    def __init__(self, config: EdgeConfig, spec: RobotSpec, *, policy: Policy | None = None) -> None:
        super().__init__(config, spec, policy=policy)
        self.pipeline.set_rtc(False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Load, then idle: inference happens on the control loop."""
        await self._prepare()
        self.pipeline.set_rtc(False)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.tick_failsafe)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self.detach_loop()

    def get_action(self, now_ns: int) -> Action | None:
        """Control loop: run the policy first if the queue is dry (blocks for the inference)."""
        if (
            self._runner is not None
            and not self.paused
            and self.pipeline.queue.empty()
            and not self.failsafe.dead.is_set()
        ):
            obs = self.latest_observation()
            if obs is not None:
                request = self.pipeline.snapshot(obs)
                try:
                    produced = self.infer(request, episode_start=self.take_episode_start())
                except Exception as exc:  # the loop must never die of a policy bug
                    self._failed(exc)
                else:
                    self._failures_in_row = 0
                    self.merge(request, produced, time.monotonic_ns())
        return super().get_action(now_ns)
