"""Reading README.md's commands, to run them as written (tests/lerobot/test_readme.py, the ROS 2 section's).

Only what a test machine must change is changed, by the caller: ports, host names, devices.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def section(title: str, level: int = 2) -> str:
    """The text of a README section, up to the next heading of its level or above (not in code blocks)."""
    lines = README.read_text().splitlines(keepends=True)
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
    """A README command as this environment runs it: its console script (``servo-serve`` …), else its
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
    stretches the forward past the edge's default buffer (a README cannot know that load)."""
    if "--buffer-time-s" not in argv:
        return argv
    i = argv.index("--buffer-time-s")
    return argv[:i] + argv[i + 2 :]


def with_token(argv: list[str], token: str) -> list[str]:
    """A README command with the join token a server printed in place of the README's."""
    out = list(argv)
    out[out.index("--join") + 1] = token
    return out
