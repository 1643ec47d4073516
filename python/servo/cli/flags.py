"""Command-line flags generated from configuration Structs (one flag per field, help = description).

The Struct stays the single source of truth: names, types, choices, defaults and the sentence of
help each flag shows all come from its fields (`servo.config.fields_of`). Values given on the
command line are returned by field name and converted by `servo.config` like a file's, so a bad
flag and a bad file entry get the same one-line error.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from servo.config import ConfigError, FieldDoc, fields_of, sections_of

#: reST inline markup of docstrings and field descriptions: ``literal``, `reference`.
_MARKUP = re.compile(r"``([^`]+)``|`([^`]+)`")


def plain(text: str) -> str:
    """``text`` without its reST inline markup, as a terminal should show it."""
    return _MARKUP.sub(lambda m: m.group(1) or m.group(2), text)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` of every servo command: the docstring's own line breaks, without reST markup."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return super()._fill_text(plain(text), width, indent)

    def _expand_help(self, action: argparse.Action) -> str:
        return plain(super()._expand_help(action))


def add_struct_flags(parser: argparse.ArgumentParser, kind: type[Any], title: str) -> None:
    """Add ``--field-name`` for every option of ``kind`` (defaults left unset so a file can win).

    The top-level options form the group ``title``; the options of each section (a field that is
    a Struct, a TOML table) form a group of their own, headed ``[section]``, with flags named
    after the option alone.
    """
    sections = sections_of(kind)
    top = parser.add_argument_group(title)
    for doc in fields_of(kind):
        if doc.name in sections:
            group = parser.add_argument_group(f"[{doc.name}] {doc.description.rstrip('.')}")
            for inner in fields_of(sections[doc.name]):
                _add_flag(group, inner)
        else:
            _add_flag(top, doc)


def _add_flag(group: argparse._ActionsContainer, doc: FieldDoc) -> None:
    flag = "--" + doc.name.replace("_", "-")
    help_text = _help(doc)
    if doc.type_text == "bool":
        group.add_argument(flag, dest=doc.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif doc.choices:
        group.add_argument(flag, dest=doc.name, choices=doc.choices, default=None, help=help_text)
    elif doc.type_text.startswith("list of"):
        group.add_argument(flag, dest=doc.name, action="append", default=None, metavar="VALUE", help=help_text)
    elif doc.type_text.startswith("table of"):
        group.add_argument(flag, dest=doc.name, action="append", default=None, metavar="KEY=VALUE", help=help_text)
    else:
        group.add_argument(flag, dest=doc.name, default=None, metavar=doc.type_text.upper(), help=help_text)


def options_of(kind: type[Any]) -> list[FieldDoc]:
    """Every option of ``kind`` that is a flag: its top-level fields and its sections' fields."""
    sections = sections_of(kind)
    out: list[FieldDoc] = []
    for doc in fields_of(kind):
        out += fields_of(sections[doc.name]) if doc.name in sections else [doc]
    return out


def struct_flag_values(args: argparse.Namespace, kind: type[Any]) -> dict[str, Any]:
    """The options of ``kind`` given on the command line, by name (a section's by their own name).

    Numbers and booleans stay text here: `servo.config.convert` parses them (``strict=False``
    semantics). Tables come from repeated ``KEY=VALUE``; a value of a
    ``table of value`` field is JSON when it parses as JSON (``--policy-options chunk_size=20``).

    Raises:
        ConfigError: a ``KEY=VALUE`` flag without ``=``.
    """
    out: dict[str, Any] = {}
    for doc in options_of(kind):
        value = getattr(args, doc.name, None)
        if value is None:
            continue
        if doc.type_text.startswith("table of"):
            value = dict(_pair(item, doc, raw=doc.type_text == "table of str") for item in value)
        elif not doc.choices and _numeric(doc) is not None:
            value = _number(value, doc)
        out[doc.name] = value
    return out


def _numeric(doc: FieldDoc) -> str | None:
    """``int`` or ``float`` for a number field, also one that takes a word instead (``int or auto``)."""
    kind = doc.type_text.split(" or ")[0]
    return kind if kind in ("int", "float") else None


def _number(text: str, doc: FieldDoc) -> Any:
    try:
        return int(text) if _numeric(doc) == "int" else float(text)
    except ValueError:
        # Left as text: the conversion names the option and the expected type (or takes the word).
        return text


def _pair(item: str, doc: FieldDoc, *, raw: bool) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--{doc.name.replace('_', '-')} expects KEY=VALUE, got {item!r}")
    if raw:
        return key, value
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _help(doc: FieldDoc) -> str:
    default = doc.default
    if (isinstance(default, list | tuple | dict) and not default) or (isinstance(default, str) and not default):
        shown = "none"
    else:
        shown = str(default)
    text = f"{doc.description} [default: {shown}]" if doc.description else f"[default: {shown}]"
    return text.replace("%", "%%")  # argparse formats help with %
