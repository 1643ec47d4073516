"""``servo-serve --lerobot PATH``: serve a LeRobot checkpoint folder without writing a manifest.

The manifest is the three-line one (``source = "lerobot"``, ``options.path``) with the flags'
values in place: everything else (fps, names, units, cameras) is read from the checkpoint
(`servo.policy.lerobot_metadata`), and ``servo-serve`` says where each came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servo.config import ConfigError, convert
from servo.policy.lerobot_checkpoint import LeRobotOptions, resolve_checkpoint
from servo.policy.lerobot_metadata import CheckpointFacts, read_facts
from servo.server.manifest import Manifest, parse_manifest

#: Flags that set a LeRobot option -> the option.
OPTION_FLAGS = {"fps": "fps", "units": "units", "action_names": "action_names"}
#: Options given comma-separated on the command line.
LIST_OPTIONS = frozenset({"action_names"})


def lerobot_manifest(path: str, flags: dict[str, Any], overrides: dict[str, Any]) -> Manifest:
    """The manifest ``--lerobot PATH`` serves.

    Args:
        path: The checkpoint directory (made absolute, so replicas elsewhere find it) or a hub id.
        flags: ``--fps`` / ``--units`` / ``--action-names`` values by option name (None when not given).
        overrides: Other manifest keys the command line sets (``zenoh.listen``, ``model.device``…).

    Raises:
        ConfigError: a flag's value is refused (named as its manifest key).
    """
    local = Path(path).expanduser()
    options: dict[str, Any] = {"path": str(local.resolve()) if local.is_dir() else path}
    for name, value in flags.items():
        if value is not None:
            listed = [item.strip() for item in value.split(",")] if name in LIST_OPTIONS else value
            options[OPTION_FLAGS[name]] = listed
    values = {"model.source": "lerobot", "model.options": options, **overrides}
    return parse_manifest("", origin="--lerobot", overrides=values)


def checkpoint_facts(manifest: Manifest) -> CheckpointFacts | None:
    """What a ``source = "lerobot"`` manifest's checkpoint says (None for other sources).

    Called once the server loaded the checkpoint, so its options are known to be valid.
    """
    if manifest.model.source != "lerobot":
        return None
    try:
        options = convert(manifest.model.options, LeRobotOptions, origin="model.options")
        checkpoint, _ = resolve_checkpoint(options.path, options.revision)
        return read_facts(checkpoint, options)
    except ConfigError:
        return None
