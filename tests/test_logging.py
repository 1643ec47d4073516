"""As a library servo prints nothing; stdlib logging decides; the CLIs render with context."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from tests.support import free_port

SCRIPT = """
import anyio, numpy as np
from servo.client import PolicyClient
from servo.transport import ZenohSettings
from tests.support import make_manifest, running_server
{setup}

async def main():
    async with running_server(make_manifest({port})):
        settings = ZenohSettings(mode="client", connect=["tcp/127.0.0.1:{port}"])
        async with PolicyClient.connect(settings, "quiet") as client:
            (server,) = await client.discover()
            session = await client.open_session(server, features=server.status.policy.features, fps=30)
            state = np.zeros(6, np.float32)
            frame = np.zeros((48, 64, 3), np.uint8)
            await session.infer(state, {{"front": frame}}, timeout=10)
            await session.close()
    print("RESULT ok")

anyio.run(main)
"""


def run(setup: str) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(setup=textwrap.dedent(setup), port=free_port())
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_library_use_prints_nothing_until_the_application_configures_logging() -> None:
    quiet = run("")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "RESULT ok\n"
    assert quiet.stderr == ""
    shown = run("import logging; logging.basicConfig(level=logging.DEBUG)")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "RESULT ok\n"
    assert "'event': 'session opened'" in shown.stderr  # context travels with the record
    assert "'client_id': 'quiet'" in shown.stderr
    silenced = run(
        'import logging; logging.basicConfig(level=logging.DEBUG); logging.getLogger("servo").setLevel(logging.ERROR)'
    )
    assert silenced.returncode == 0, silenced.stderr  # silenced because filtered, not because it never ran
    assert silenced.stdout == "RESULT ok\n"
    assert "session opened" not in silenced.stderr


def test_every_module_logs_through_servo_logs() -> None:
    """structlog's own loggers print to stdout unless configured: modules must use servo.logs."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "python" / "servo"
    offenders = []
    for path in package.rglob("*.py"):
        if path.name == "logs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("get_logger", "getLogger")
                and isinstance(node.value, ast.Name)
                and node.value.id == "structlog"
            ):
                offenders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert offenders == []


def test_logged_strings_are_escaped_and_cut() -> None:
    """What a peer sends (a client id, a task, tags) can neither forge log lines nor flood them."""
    from servo.logs import MAX_FIELD_CHARS, MAX_FIELD_ITEMS, clean

    assert clean("robot-7\x1b[2J\x1b[Hfake line\nsecond\u202eevil") == (
        "robot-7\\x1b[2J\\x1b[Hfake line\\x0asecond\\u202eevil"
    )
    assert clean("plain text, café") == "plain text, café"
    huge = clean("x" * 5_000_000)
    assert len(huge) < MAX_FIELD_CHARS + 30
    assert huge.endswith("…(+4999744 chars)")
    tags = clean({f"k{i}\n": "v" * 1000 for i in range(100)})
    assert len(tags) == MAX_FIELD_ITEMS + 1
    assert "k0\\x0a" in tags
    assert tags["…"] == f"+{100 - MAX_FIELD_ITEMS} items"
    assert clean(b"\x00\xff" * 1000).startswith("b'\\x00\\xff")
    assert clean([[["deep"]]], depth=1) == ["<1 items>"]
    assert clean(3.5) == 3.5


def test_a_hostile_field_renders_as_one_short_console_line() -> None:
    import io

    from servo.logs import configure_logging, get_logger

    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("info", stream=out)
    try:
        get_logger("servo.test").info(
            "session opened", client_id="evil\x1b]0;owned\x07\r\nERROR fake", task="t" * 10**6
        )
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    text = out.getvalue()
    assert text.count("\n") == 1
    assert "\x1b" not in text
    assert "\r" not in text
    assert "x1b]0;owned" in text  # shown, escaped
    assert len(text) < 1000


def test_a_throttle_lets_one_line_per_key_per_interval_and_counts_the_rest() -> None:
    from servo.logs import LogThrottle

    now = [0.0]
    throttle = LogThrottle(1.0, max_keys=2, clock=lambda: now[0])
    assert throttle.allow("mac") == 0
    assert [throttle.allow("mac") for _ in range(5)] == [None] * 5
    assert throttle.allow("shape") == 0  # another key is not muted
    now[0] = 1.5
    assert throttle.allow("mac") == 5  # the lines held back, logged with the next one
    assert throttle.allow("mac") is None
    throttle.allow("epoch")  # a third key evicts the least recently used ("shape")
    assert throttle.allow("shape") == 0
