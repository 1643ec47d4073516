"""Reading the guides' commands (docs/guides/*.md), to run them as written.

Used by tests/lerobot/test_readme.py (the LeRobot guide), tests/robots/ros2/test_readme.py (the
ROS 2 guide) and the observability tests (the operations runbook's queries).

Only what a test machine must change is changed, by the caller: ports, host names, devices.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUIDES = REPO / "docs" / "guides"


def guide(name: str) -> str:
    """The text of ``docs/guides/<name>.md``."""
    return (GUIDES / f"{name}.md").read_text()


def section(text: str, title: str, level: int = 2) -> str:
    """The section ``title`` of a page, up to the next heading of its level or above (not in code blocks)."""
    lines = text.splitlines(keepends=True)
    start = lines.index(f"{'#' * level} {title}\n")
    fenced = False
    for end in range(start + 1, len(lines)):
        line = lines[end]
        fenced ^= line.startswith("```")
        heading = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < heading <= level and line[heading : heading + 1] == " ":
            return "".join(lines[start:end])
    return "".join(lines[start:])


def commands(text: str) -> list[list[str]]:
    """The shell commands of a section's ``bash`` blocks, as argv."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if argv := shlex.split(line, comments=True):
                found.append(argv)
    return found


def command(found: list[list[str]], *start: str) -> list[str]:
    """The one command that starts with ``start``."""
    (argv,) = [argv for argv in found if argv[: len(start)] == list(start)]
    return argv


def program(argv: list[str]) -> list[str]:
    """A guide's command as this environment runs it: its console script (``servo-serve`` …), else its
    module; ``python`` is this interpreter."""
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    script = Path(sys.executable).with_name(argv[0])
    if script.exists():
        return [str(script), *argv[1:]]
    return [sys.executable, "-m", f"servo.cli.{argv[0].removeprefix('servo-')}", *argv[1:]]


def option(argv: list[str], flag: str) -> str:
    """The value after ``flag``."""
    return argv[argv.index(flag) + 1]


def without_asked_buffer(argv: list[str]) -> list[str]:
    """A printed command less the ``--buffer-time-s`` the capacity plan adds when this machine's load
    stretches the forward past the edge's default buffer (a guide cannot know that load)."""
    if "--buffer-time-s" not in argv:
        return argv
    i = argv.index("--buffer-time-s")
    return argv[:i] + argv[i + 2 :]


def with_token(argv: list[str], token: str) -> list[str]:
    """A guide's command with the join token a server printed in place of the guide's."""
    out = list(argv)
    out[out.index("--join") + 1] = token
    return out
