"""Deploying replicas of one policy server on a cluster engine.

`servo.deploy.plan` derives what each replica runs with and `servo.deploy.host` runs one server on
its own event loop; neither imports a cluster engine. `servo.deploy.ray` (the ``ray`` extra) starts
the replicas as Ray actors and is imported only by whoever asks for Ray.
"""

from __future__ import annotations

from servo.errors import StartError


class DeployError(StartError, RuntimeError):
    """The replicas cannot be started on the cluster."""
