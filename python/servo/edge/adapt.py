"""``--robot sim`` shaped like the policy it drives: joints, units, rate and cameras from the server.

The simulated arm is an SO-100 unless told otherwise; a policy of seven or fourteen joints, at
15 fps, with a ``laptop`` camera would refuse it (``action names do not match the policy``). So
before the edge starts, `fit_robot` asks the servers the edge would use (the same link, filters
and trust) what they serve, and fills in every sim option the user did not give from the
policy: its action names and units (when they are not the SO-100's), its rate, its cameras at
its input size. A real robot is never changed: its joints are what they are.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio

from servo.client import NoServerFound, PolicyClient, RequestTimeout, UntrustedServer
from servo.edge.backoff import Backoff
from servo.edge.config import EdgeConfig
from servo.edge.errors import EdgeStartError
from servo.robots.registry import RobotDescription
from servo.robots.so100_joints import JOINT_NAMES, UNITS_DEGREES
from servo.wire import PolicyInfo

#: The robot `fit_robot` shapes; real robots are left as given.
SIM = "sim"


async def fit_robot(robot: RobotDescription, config: EdgeConfig) -> RobotDescription:
    """``robot`` with the served policy's joints, units, fps and cameras where a sim was given none.

    Only a remote ``--robot sim`` is fitted, and only options the user left out.

    Raises:
        EdgeStartError: no usable server within ``connect_timeout_s`` (one line), or none trusted.
    """
    if robot.robot != SIM or config.inference != "remote" or not set(FITTED) - set(robot.options):
        return robot
    policy = await served_policy(config)
    return RobotDescription(robot.robot, fitted_sim_options(robot.options, policy))


#: Sim options a policy fills in.
FITTED = ("joints", "units", "fps", "cameras")


def fitted_sim_options(options: dict[str, Any], policy: PolicyInfo) -> dict[str, Any]:
    """The sim's options with the policy's values for those not given (see the module docstring)."""
    features, out = policy.features, dict(options)
    names, units = list(features.action_names), list(features.action_units)
    so100 = names == list(JOINT_NAMES) and units in ([], list(UNITS_DEGREES))
    if "joints" not in out and not so100:
        out["joints"] = names
        if "units" not in out and any(units):
            out["units"] = units
    out.setdefault("fps", policy.fps)
    if "cameras" not in out:
        cameras = [f"{name}:{camera.width}x{camera.height}" for name, camera in features.cameras.items()]
        out["cameras"] = ",".join(cameras) or "none"
    return out


async def served_policy(config: EdgeConfig) -> PolicyInfo:
    """What the least-loaded usable server of ``config`` serves (discovered as the engine would).

    Raises:
        EdgeStartError: no usable server within ``connect_timeout_s``, or none with a trusted identity.
    """
    from servo.edge.link import no_server, open_link, prepare_join

    config = await prepare_join(config)  # a joining robot reaches its server only once it is pinned
    link, server = config.link, config.server
    async with contextlib.AsyncExitStack() as stack:
        zsession = await open_link(config, stack)
        client = PolicyClient(
            zsession,
            config.resolved_client_id(SIM),
            trusted=config.security.trusted(),
            identity=await anyio.to_thread.run_sync(config.security.identity),
            known=config.security.known(),
        )
        backoff = Backoff(
            link.reconnect_initial_backoff_s, link.reconnect_max_backoff_s, deadline_s=link.connect_timeout_s
        )
        while True:
            try:
                servers = await client.discover(app=server.app or None, model=server.model or None)
                usable = [s for s in servers if not server.replica or s.keys.replica == server.replica]
                if usable:
                    return usable[0].status.policy
                problem = f"no replica {server.replica!r} answered"
            except UntrustedServer as exc:
                raise EdgeStartError(str(exc), refused=True) from None
            except (NoServerFound, RequestTimeout) as exc:
                problem = str(exc)
            if not await backoff.wait():
                raise no_server(config, problem)
