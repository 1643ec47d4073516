"""Every command's --help reads as plain text in a terminal: no reST markup from the docstrings."""

from __future__ import annotations

import argparse
import importlib
import tomllib
from pathlib import Path

import pytest

from servo.cli.flags import plain

SCRIPTS = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]


def helps(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's help and each of its sub-commands' (servo-dataset export)."""
    texts = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts += [sub.format_help() for sub in action.choices.values()]
    return texts


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_shows_no_rest_markup(script: str) -> None:
    module = importlib.import_module(SCRIPTS[script].partition(":")[0])
    parser: argparse.ArgumentParser = module.build_parser()
    assert parser.prog == script
    for text in helps(parser):
        assert "`" not in text, text
    # what the docstring marked up is still there, as plain words
    assert (module.__doc__ or "").split(":")[0].replace("`", "") in helps(parser)[0]


def test_plain_drops_literal_and_reference_markup() -> None:
    assert plain("``--ray`` starts `servo-serve` replicas (``a*b``)") == "--ray starts servo-serve replicas (a*b)"
    assert plain("no markup: 2 * 3") == "no markup: 2 * 3"
