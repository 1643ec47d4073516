"""The generated references leave nothing out: every command, flag and configuration field is in them.

The flags are read from each command's own ``--help`` text and the fields from the Structs
themselves, independently of how the generators walk them, so a flag, subcommand, table or field
the generators miss fails here (a new one cannot go undocumented).
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import msgspec.inspect as mi
import pytest

from servo.edge.config import EdgeConfig
from servo.router.fleet import Fleet
from servo.server.manifest import Manifest
from tests.docs.pages import ROOT, generator

SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
_FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
_HEADING = re.compile(r"^## (.+)$", re.M)
_ROW_KEY = re.compile(r"^\| `([^`]+)` \|", re.M)


@pytest.fixture(scope="module")
def cli_page() -> str:
    cli = generator("reference_cli")
    return str(cli.markdown(cli.commands(ROOT / "pyproject.toml")))


def command_parsers() -> dict[str, Any]:
    """Every command line a user can type: each console script, and the subcommands it dispatches."""
    import importlib

    found = {}
    for name, target in SCRIPTS.items():
        module = importlib.import_module(target.partition(":")[0])
        found[name] = module.build_parser()
        for sub, owner in getattr(module, "SUBCOMMANDS", {}).items():
            found[f"{name} {sub}"] = importlib.import_module(owner).build_parser()
    return found


def test_every_console_script_has_a_parser_and_a_section(cli_page: str) -> None:
    sections = set(_HEADING.findall(cli_page))
    commands = command_parsers()
    assert set(SCRIPTS) <= set(commands)
    assert set(commands) <= sections, sorted(set(commands) - sections)


def test_every_flag_of_every_command_is_in_the_cli_reference(cli_page: str) -> None:
    sections = dict(zip(_HEADING.findall(cli_page), re.split(r"^## .+$", cli_page, flags=re.M)[1:], strict=True))
    missing = []
    for name, parser in command_parsers().items():
        usage_and_help = parser.format_usage() + "\n".join(
            " ".join(action.option_strings) for action in parser._actions
        )
        flags = set(_FLAG.findall(usage_and_help))
        assert flags, name
        missing += [f"{name} {flag}" for flag in sorted(flags) if f"`{flag}" not in sections[name]]
    assert missing == []


def struct_keys(kind: type[Any]) -> set[tuple[str, str]]:
    """(table, key) of every leaf field of a Struct, tables as dotted paths ("" = top level)."""
    out: set[tuple[str, str]] = set()

    def walk(info: mi.Type, table: str) -> None:
        assert isinstance(info, mi.StructType)
        for field in info.fields:
            inner = field.type
            while isinstance(inner, mi.Metadata):
                inner = inner.type
            if isinstance(inner, mi.UnionType):
                members = [t for t in inner.types if not isinstance(t, mi.NoneType)]
                inner = members[0] if len(members) == 1 else inner
            if isinstance(inner, mi.ListType) and isinstance(inner.item_type, mi.StructType):
                inner = inner.item_type
            path = f"{table}.{field.encode_name}".lstrip(".")
            if isinstance(inner, mi.StructType):
                walk(inner, path)
            else:
                out.add((table, field.encode_name))

    walk(mi.type_info(kind), "")
    return out


def documented_keys(page: str) -> set[tuple[str, str]]:
    """(table, key) of every row of a generated configuration page."""
    out = set()
    for heading, body in zip(_HEADING.findall(page), re.split(r"^## .+$", page, flags=re.M)[1:], strict=True):
        table = heading.strip("`[]") if heading.startswith("`") else ""
        out |= {(table, key) for key in _ROW_KEY.findall(body)}
    return out


@pytest.mark.parametrize("kind", [Manifest, EdgeConfig, Fleet], ids=lambda kind: kind.__name__)
def test_every_configuration_field_is_in_its_reference(kind: type[Any]) -> None:
    page = generator("reference_config").markdown("title", "intro", kind)
    keys = struct_keys(kind)
    assert len(keys) > 10
    assert keys - documented_keys(page) == set()


def test_every_edge_option_names_its_flag() -> None:
    config = generator("reference_config")
    flags = {a.dest: a.option_strings[0] for a in command_parsers()["servo-edge"]._actions if a.option_strings}
    page = config.markdown("title", "intro", EdgeConfig, flag_of=lambda field: flags.get(field.name))
    for table, key in struct_keys(EdgeConfig):
        assert f"| `{key}` |" in page
        assert f"`--{key.replace('_', '-')}`" in page, (table, key)
