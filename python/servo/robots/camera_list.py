"""Camera lists as the ``cameras`` robot option writes them: ``name[:source][:WxH[@FPS]],…``."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CameraEntry:
    """One parsed item of a ``cameras`` option, ``name[:source][:WxH[@FPS]]``. Immutable."""

    name: str
    source: int | str | None
    width: int | None
    height: int | None
    fps: float | None


_SIZE = re.compile(r"(?P<w>\d+)x(?P<h>\d+)(?:@(?P<fps>\d+(?:\.\d*)?))?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def parse_cameras(value: str) -> list[CameraEntry]:
    """Parse a camera list such as ``"front:0:640x480@30,wrist:/dev/video2:640x480@30"``.

    The size is width x height (OpenCV's order); the source may itself contain colons (the
    ``/dev/v4l/by-path/...`` names do), so only the first field and a trailing size are split
    off. ``""`` or ``"none"`` means no cameras.

    Raises:
        ValueError: a malformed entry or a repeated name.
    """
    if value.strip().lower() in ("", "none"):
        return []
    entries = []
    for item in value.split(","):
        parts = item.strip().split(":")
        name, rest = parts[0], parts[1:]
        if not _NAME.fullmatch(name):
            raise ValueError(f"camera {item!r}: {name!r} is not a valid camera name")
        size = _SIZE.fullmatch(rest[-1]) if rest else None
        if size:
            rest.pop()
        source_text = ":".join(rest)
        source: int | str | None = None
        if source_text:
            source = int(source_text) if source_text.isdigit() else source_text
        entries.append(
            CameraEntry(
                name=name,
                source=source,
                width=int(size["w"]) if size else None,
                height=int(size["h"]) if size else None,
                fps=float(size["fps"]) if size and size["fps"] else None,
            )
        )
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"camera names repeat in {names}")
    return entries
