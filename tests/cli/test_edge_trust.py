"""``servo-edge trust``: dispatched by servo-edge to its own command, which edits the known-servers file."""

from __future__ import annotations

from pathlib import Path

import pytest

from servo.cli import edge
from servo.wire import fingerprint


def test_servo_edge_dispatches_trust_and_the_file_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "known_servers"
    identity = fingerprint(bytes(range(32)))
    assert edge.main(["trust", "--known-servers", str(known), "--app", "kitchen", identity]) == 0
    assert f"kitchen/* {identity}" in known.read_text()

    assert edge.main(["trust", "--known-servers", str(known)]) == 0
    assert f"kitchen/* {identity}" in capsys.readouterr().out


def test_every_subcommand_has_a_parser_for_its_help() -> None:
    import importlib

    for name, owner in edge.SUBCOMMANDS.items():
        assert importlib.import_module(owner).build_parser().prog == f"servo-edge {name}"
