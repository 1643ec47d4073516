"""Other protocols in front of a servo server, served by the same policy, scheduler and sessions.

A frontend (`servo.server.frontend.Frontend`) is started by `servo.server.service.PolicyServer`
(``frontends=``) on its event loop and reaches the policy only through ordinary servo sessions
opened with `servo.client` on the server's own Zenoh session, signed by the server's identity: a
frontend's requests are admitted, scheduled, audited and counted exactly like a robot's. Each
frontend's dependencies are imported only when it is configured.
"""

from __future__ import annotations

from servo.server.frontend import Frontend
from servo.server.manifest import Manifest


def frontends_of(manifest: Manifest) -> list[Frontend]:
    """The frontends a manifest's ``[frontends]`` asks for (admitting callers by its ``[security]``).

    Raises:
        ModuleNotFoundError: a configured frontend's extra is not installed (``websockets`` for
            openpi: ``pip install 'servo-robotics[openpi]'``).
    """
    out: list[Frontend] = []
    openpi, security = manifest.frontends.openpi, manifest.security
    if openpi is not None:
        from servo.frontends.openpi import OpenpiFrontDoor
        from servo.frontends.openpi_gate import OpenpiGate

        gate = OpenpiGate(openpi, manifest.limits, insecure=security.insecure, any_client=security.allow_any_robot)
        out.append(OpenpiFrontDoor(openpi, gate))
    return out
