"""The control process of a ROS 2 robot: Cyclone DDS's threads run just below the real-time tick
(never beside it at normal priority), and the loop stops at its next tick beside a CPU hog."""

from __future__ import annotations

import pytest

from servo.edge.actions import ControlConfig
from servo.edge.pipeline import ChunkPipeline, PipelineConfig
from servo.edge.realtime import HELPER_PRIORITY, REALTIME_PRIORITY, thread_table
from servo.robots import RobotDescription
from tests.edge.harness import can_be_realtime, process_loop, stop_beside_a_hog
from tests.robots.ros2.node import RosEnv
from tests.support import eventually

pytestmark = pytest.mark.anyio

#: Cyclone's own threads: receive, delivery (built-in and user data), timed events, garbage collector.
DDS_THREADS = {"recv", "dq.builtins", "dq.user", "tev", "gc"}


async def test_dds_threads_run_below_the_tick_and_the_loop_stops_beside_a_cpu_hog(ros_env: RosEnv) -> None:
    node = ros_env.start_node()
    try:
        # A starved arm publishes late: a generous state bound keeps this about scheduling.
        robot = RobotDescription("ros2", ros_env.robot_options(state_timeout_s=30))
        spec = robot.spec()
        config = PipelineConfig(rtc=False, execution_horizon=0)
        pipe = ChunkPipeline(spec.action_dim, spec.fps, config, ControlConfig(max_action_age_s=60.0))
        async with process_loop(robot, pipe) as loop:
            assert loop.pid is not None
            pid = loop.pid

            def names() -> set[str]:
                return {thread.name for thread in thread_table(pid)}

            await eventually(lambda: DDS_THREADS | {"servo-watchdog"} <= names(), 10, "the threads named")
            table = thread_table(pid)
            tick = [thread for thread in table if thread.tid == pid]
            others = {(thread.policy, thread.priority) for thread in table if thread.tid != pid}
            if can_be_realtime():
                assert [(t.name, t.policy, t.priority) for t in tick] == [("servo-tick", "fifo", REALTIME_PRIORITY)]
                assert others == {("rr", HELPER_PRIORITY)}, table
            else:  # nothing changes where real-time scheduling is not permitted
                assert [(t.name, t.policy) for t in tick] == [("servo-tick", "other")]
                assert others == {("other", 0)}, table
            await stop_beside_a_hog(loop)  # the DDS participant closed, exit code 0
    finally:
        node.stop()
