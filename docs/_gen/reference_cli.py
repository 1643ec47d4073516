"""The command-line reference: every console script of ``pyproject.toml``, from its own argparse parser.

A script ``name = "package.module:main"`` is documented from ``package.module.build_parser()``
(which must build the parser without side effects); a module may also name subcommands it
dispatches itself in ``SUBCOMMANDS`` (``{"trust": "servo.cli.trust"}``: that module's
``build_parser()``), and argparse subparsers are followed. A new script is therefore documented
as soon as it is declared, and one without ``build_parser()`` stops the docs build.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import tomllib
from pathlib import Path

from markdown_text import cell, from_rest

#: Wide enough that usage lines wrap rarely, narrow enough to fit the page's code blocks.
_WIDTH = 88


@dataclasses.dataclass(frozen=True)
class Command:
    """One documented command line: ``servo-edge`` or ``servo-edge trust``."""

    name: str
    parser: argparse.ArgumentParser


def commands(pyproject: Path) -> list[Command]:
    """Every command of the project's console scripts, in declaration order.

    Raises:
        LookupError: a script's module has no ``build_parser()``.
    """
    scripts: dict[str, str] = tomllib.loads(pyproject.read_text())["project"]["scripts"]
    found: list[Command] = []
    for name, target in scripts.items():
        module = importlib.import_module(target.partition(":")[0])
        found += _with_subcommands(name, _parser_of(module, name))
        for sub, owner in getattr(module, "SUBCOMMANDS", {}).items():
            found += _with_subcommands(f"{name} {sub}", _parser_of(importlib.import_module(owner), f"{name} {sub}"))
    return found


def _parser_of(module: object, name: str) -> argparse.ArgumentParser:
    build = getattr(module, "build_parser", None)
    if build is None:
        raise LookupError(f"{name}: {getattr(module, '__name__', module)} has no build_parser() to document it from")
    parser: argparse.ArgumentParser = build()
    parser.formatter_class = functools.partial(parser.formatter_class, width=_WIDTH)  # type: ignore[assignment]
    return parser


def _with_subcommands(name: str, parser: argparse.ArgumentParser) -> list[Command]:
    found = [Command(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                found += _with_subcommands(f"{name} {sub}", subparser)
    return found


def flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of a parser (``--robot``, ``--no-rtc``, ``-h``…)."""
    return [option for action in parser._actions for option in action.option_strings]


def markdown(found: list[Command]) -> str:
    """The reference page: one section per command, one table per argument group."""
    lines = [
        "# Command-line reference",
        "",
        "Generated from each command's own parser when the site is built: what `--help` prints, "
        "as tables. Every edge option of the configuration file is also a flag of `servo-edge` "
        "([edge options](edge-config.md)).",
        "",
    ]
    for command in found:
        lines += _command(command)
    return "\n".join(lines)


def _command(command: Command) -> list[str]:
    parser = command.parser
    lines = [f"## {command.name}", ""]
    if parser.description:
        lines += [from_rest(parser.description), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    formatter = argparse.HelpFormatter(parser.prog, width=_WIDTH)
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if not actions:
            continue
        title = group.title or "options"
        lines += [f"### {command.name}: {from_rest(title)}", ""]
        if group.description:
            lines += [from_rest(group.description), ""]
        lines += ["| argument | description |", "|---|---|"]
        for action in actions:
            lines.append(f"| {_invocation(action)} | {cell(_help(formatter, action))} |")
        lines.append("")
    if parser.epilog:
        # An epilog headed "robot options (…):" is shown under that title.
        epilog = parser.epilog.strip()
        first, _, rest = epilog.partition("\n")
        title, body = (first.removesuffix(":"), rest) if first.endswith(":") and rest else ("more", epilog)
        lines += [f"### {command.name}: {title}", "", "```text", body.rstrip(), "```", ""]
    return lines


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{_metavar(action)}`"
    value = "" if action.nargs == 0 else f" {_metavar(action)}"
    return ", ".join(f"`{option}{value}`" for option in action.option_strings)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _help(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    text = formatter._expand_help(action) if action.help else ""
    shown = action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in text
    return f"{text} [default: {action.default}]" if shown else text
