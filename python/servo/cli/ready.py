"""What ``servo-serve`` says once its server is ready.

What it serves and where each fact of a LeRobot checkpoint came from; where it listens and its
identity; how many robots one replica carries (the capacity plan, with a one-line warning when
a forward outlasts a chunk); the ``servo-edge`` commands that reach it; its health endpoint and
front doors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servo.cli.lerobot import checkpoint_facts
from servo.cli.listen import edge_command, robot_options
from servo.deploy.capacity import CapacityPlan, measured_forward_s
from servo.home import server_identity_path
from servo.server.manifest import Manifest
from servo.transport import exposed_endpoint, loopback_host

if TYPE_CHECKING:
    from servo.server.selfsigned import ServerCertificate
    from servo.server.service import ServerReady

#: The arm a LeRobot checkpoint is shown driving when its dataset names no robot servo knows.
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
    lines += capacity_lines(ready, manifest)
    lines += connect_lines(ready, manifest, certificate, arm=None if facts is None else facts.robot or DEFAULT_ARM)
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


def capacity_lines(ready: ServerReady, manifest: Manifest) -> list[str]:
    """The capacity plan from the warm-up forwards, for robots with the edge's default buffer."""
    from servo.edge.pipeline import PipelineConfig

    forward_s = measured_forward_s(ready.warmup_s)
    if forward_s is None:
        return ["capacity: no plan without a warm-up forward to time (model.warmup = 0)"]
    info = ready.info
    plan = CapacityPlan(
        forward_s, info.chunk_size, info.fps, rtc=info.supports_rtc, buffer_s=PipelineConfig().buffer_time_s
    )
    max_sessions = 1 if info.serving_mode == "exclusive" else manifest.serving.max_sessions
    return plan.describe(device=manifest.model.device, max_sessions=max_sessions)


def connect_lines(
    ready: ServerReady, manifest: Manifest, certificate: ServerCertificate | None, *, arm: str | None
) -> list[str]:
    """How edges reach the first listen endpoint: the certificate to copy, a real arm's and the sim's command."""
    listen = manifest.zenoh.listen
    if not listen:
        return []
    cameras, fps = list(ready.info.features.cameras), ready.info.fps
    lines = []
    join = ready.join_token
    if certificate is not None:
        names = ", ".join([*certificate.dns_names, *certificate.addresses])
        copy = "the join token pins it" if join else f"copy it to each robot as {certificate.cert.name}"
        lines.append(
            f"TLS with the self-signed certificate {certificate.cert} ({certificate.state}; names {names}); {copy}"
        )
    if arm is not None:
        options = robot_options(cameras=cameras, fps=fps, sim=False)
        command = edge_command(listen[0], robot=arm, certificate=certificate, options=options, join=join)
        if command is not None:
            lines.append(f"on the robot: {command}")
    sim = edge_command(
        listen[0],
        robot="sim",
        certificate=certificate,
        options=robot_options(cameras=cameras, fps=fps, sim=True),
        join=join,
    )
    if sim is not None:
        lines.append(f"without hardware: {sim}")
    return lines
