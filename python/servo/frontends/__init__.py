"""Other protocols in front of a servo server, served by the same policy, scheduler and sessions.

A frontend (`servo.server.frontend.Frontend`) is started by `servo.server.service.PolicyServer`
(``frontends=``) on its event loop and reaches the policy only through ordinary servo sessions
opened with `servo.client` on the server's own Zenoh session, signed by the server's identity: a
frontend's requests are admitted, scheduled, audited and counted exactly like a robot's. Each
frontend's dependencies are imported only when it is configured.
"""

from __future__ import annotations

from servo.server.frontend import Frontend
from servo.server.manifest import FrontendsSection


def frontends_of(section: FrontendsSection) -> list[Frontend]:
    """The frontends a manifest's ``[frontends]`` asks for.

    Raises:
        ModuleNotFoundError: a configured frontend's extra is not installed (``websockets`` for
            openpi: ``pip install 'servo-robotics[openpi]'``).
    """
    out: list[Frontend] = []
    if section.openpi is not None:
        from servo.frontends.openpi import OpenpiFrontDoor

        out.append(OpenpiFrontDoor(section.openpi))
    return out
