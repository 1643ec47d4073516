"""What ``servo-serve`` says once its server is ready.

What it serves and where each fact of a LeRobot checkpoint came from; where it listens and its
identity; how many robots one replica carries (the capacity plan, with a one-line warning when
a forward outlasts a chunk); the ``servo-edge`` commands that reach it; its health endpoint and
front doors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servo.cli.lerobot import checkpoint_facts
from servo.cli.listen import arm_options, edge_command
from servo.deploy.capacity import CapacityPlan, ForwardTiming
from servo.home import server_identity_path
from servo.policy.lerobot_metadata import CheckpointFacts
from servo.robots.so100_joints import JOINT_NAMES
from servo.server.manifest import Manifest
from servo.transport import exposed_endpoint, loopback_host

if TYPE_CHECKING:
    from servo.server.selfsigned import ServerCertificate
    from servo.server.service import ServerReady

#: The arm a policy of the SO arm's joints is shown driving when its dataset names no arm servo knows.
DEFAULT_ARM = "so101"


def ready_lines(ready: ServerReady, manifest: Manifest, certificate: ServerCertificate | None) -> list[str]:
    """Every line, in order (each printed after ``servo-serve:``)."""
    info, z = ready.info, manifest.zenoh
    lines = [
        f"serving {info.model} rev {info.revision} ({info.serving_mode}, "
        f"chunk {info.chunk_size} @ {info.fps:g} fps, RTC {'yes' if info.supports_rtc else 'no'})",
        f"actions: {', '.join(info.features.action_names)}; cameras: {', '.join(info.features.cameras) or 'none'}",
    ]
    facts = checkpoint_facts(manifest)
    if facts is not None:
        lines.append(facts.describe())
    lines.append(f"zenoh {z.mode}: listen {z.listen or '-'} connect {z.connect or '-'}; key {ready.keys.prefix}")
    lines += security_lines(ready, manifest)
    timing = ForwardTiming.measure(ready.forward_s)
    plan = None if timing is None else capacity_plan(ready, timing)
    lines += capacity_lines(ready, manifest, plan, timing)
    lines += connect_lines(ready, manifest, certificate, plan=plan, facts=facts)
    if ready.health_port:
        lines.append(f"health http://{manifest.ops.health_host}:{ready.health_port}/healthz  metrics /metrics")
    for name, url in ready.frontends.items():
        health = url.replace("ws", "http", 1)
        openpi = manifest.frontends.openpi
        keys = openpi is not None and not loopback_host(openpi.host) and not manifest.security.allow_any_robot
        needs = "; clients need an API key: servo-serve robots api-key NAME" if keys else ""
        lines.append(f"{name} front door {url} (health {health}/healthz){needs}")
    return lines


def security_lines(ready: ServerReady, manifest: Manifest) -> list[str]:
    """Who the server is, who may connect, and what it exposes on purpose."""
    security = manifest.security
    kept = (
        "ephemeral"
        if security.ephemeral_identity
        else f"from {security.identity_key or server_identity_path(manifest.serving.app)}"
    )
    trust = "a join token pins it" if ready.join_token else "edges trust it on first contact"
    lines = [f"identity {ready.fingerprint} ({kept}); {trust}, or pin it with --trusted-servers"]
    if ready.closed:
        uses = security.join_token_uses
        token = (
            f"; the command below joins {'one robot' if uses == 1 else f'{uses} robots'} within "
            f"{_duration(security.join_token_ttl_s)} (more: servo-serve robots token)"
            if ready.join_token
            else "; join tokens: servo-serve robots token"
        )
        lines.append(f"robots: only enrolled robots may connect ({ready.enrolled} enrolled){token}")
    elif security.allow_any_robot:
        lines.append("robots: any robot may connect (--allow-any-robot): anyone who reaches this server takes capacity")
    else:
        lines.append("robots: any robot may connect (loopback only, none enrolled in the manifest)")
    if security.insecure and any(exposed_endpoint(endpoint) for endpoint in manifest.zenoh.listen):
        lines.append("insecure: a plain tcp/ endpoint is open to the network; anyone on it reads every robot's traffic")
    return lines


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:g} s"


def capacity_plan(ready: ServerReady, timing: ForwardTiming) -> CapacityPlan:
    """The plan from the requests timed after warm-up, for robots with the edge's default buffer."""
    from servo.edge.pipeline import PipelineConfig

    info = ready.info
    return CapacityPlan(
        timing.median_s,
        info.chunk_size,
        info.fps,
        rtc=info.supports_rtc,
        buffer_s=PipelineConfig().buffer_time_s,
        tuning=info.tuning,
    )


def capacity_lines(
    ready: ServerReady, manifest: Manifest, plan: CapacityPlan | None, timing: ForwardTiming | None
) -> list[str]:
    """The capacity plan, or why there is none."""
    if plan is None:
        return ["capacity: no plan without forwards timed after a warm-up (model.warmup, model.plan_forwards)"]
    max_sessions = 1 if ready.info.serving_mode == "exclusive" else manifest.serving.max_sessions
    return plan.describe(device=manifest.model.device, max_sessions=max_sessions, timing=timing)


def connect_lines(
    ready: ServerReady,
    manifest: Manifest,
    certificate: ServerCertificate | None,
    *,
    plan: CapacityPlan | None,
    facts: CheckpointFacts | None,
) -> list[str]:
    """How edges reach the first listen endpoint: the certificate to copy, the robot's and the sim's command.

    The robot is the manifest's ``[robot]``, else an SO-100/101 arm for a policy of its joints;
    the sim (which takes the policy's joints, rate and cameras) is always shown. Each command
    carries the policy's rate and the edge buffer the capacity plan asked for.
    """
    listen = manifest.zenoh.listen
    if not listen:
        return []
    info = ready.info
    lines = []
    join = ready.join_token
    if certificate is not None:
        names = ", ".join([*certificate.dns_names, *certificate.addresses])
        copy = "the join token pins it" if join else f"copy it to each robot as {certificate.cert.name}"
        lines.append(
            f"TLS with the self-signed certificate {certificate.cert} ({certificate.state}; names {names}); {copy}"
        )
    buffer = None if plan is None else plan.edge_buffer_s
    robot: tuple[str, dict[str, str]] | None = None
    if manifest.robot is not None:
        robot = manifest.robot.type, manifest.robot.option_text()
    elif list(info.features.action_names) == list(JOINT_NAMES):
        arm = (facts.robot if facts is not None else None) or DEFAULT_ARM
        robot = arm, arm_options(cameras=list(info.features.cameras), units=info.features.action_units)
    if robot is not None:
        command = edge_command(
            listen[0],
            robot=robot[0],
            certificate=certificate,
            fps=info.fps,
            buffer_time_s=buffer,
            options=robot[1],
            join=join,
        )
        if command is not None:
            lines.append(f"on the robot: {command}")
    sim = edge_command(listen[0], robot="sim", certificate=certificate, fps=info.fps, buffer_time_s=buffer, join=join)
    if sim is not None:
        lines.append(f"without hardware: {sim}")
    return lines
