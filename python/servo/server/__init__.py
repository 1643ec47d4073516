"""The policy server: one model on one device, serving many robots over Zenoh.

Public names (imported when first used, see `servo._exports`): `PolicyServer` and what its `run`
reports (`ServerReady`), and the manifest it serves (`Manifest`, `load_manifest`,
`parse_manifest`; its errors are `servo.config.ConfigError`).
"""

from typing import TYPE_CHECKING

from servo._exports import lazy_exports

if TYPE_CHECKING:
    from servo.server.manifest import Manifest as Manifest
    from servo.server.manifest import load_manifest as load_manifest
    from servo.server.manifest import parse_manifest as parse_manifest
    from servo.server.service import PolicyServer as PolicyServer
    from servo.server.service import ServerReady as ServerReady

else:  # at run time: imported when first used (type checkers read the imports above)
    __all__, __getattr__, __dir__ = lazy_exports(globals())
