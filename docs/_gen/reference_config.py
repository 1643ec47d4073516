"""The configuration reference: every field of the manifest, the edge options and the fleet file.

Each file is a frozen msgspec Struct (`servo.config`); its TOML tables are the Struct-typed fields,
walked here depth first. A field is listed with its TOML key, type, default, constraints (the
bounds its `msgspec.Meta` carries, the values a `Literal` allows) and its one sentence of help.
A new field therefore appears in the reference the moment it is declared.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi
from markdown_text import cell

from servo.config import FieldDoc, fields_of

#: Constraint attributes of msgspec's type descriptions, and how each reads.
_BOUNDS = {
    "gt": "> {}",
    "ge": "≥ {}",
    "lt": "< {}",
    "le": "≤ {}",
    "multiple_of": "multiple of {}",
    "min_length": "length ≥ {}",
    "max_length": "length ≤ {}",
    "pattern": "matches `{}`",
}


@dataclasses.dataclass(frozen=True)
class Field:
    """One configurable key: where it sits and what it takes."""

    key: str  # dotted TOML key, e.g. "serving.max_sessions"
    name: str  # the key's last part
    type_text: str
    default: str
    constraints: str
    description: str


@dataclasses.dataclass(frozen=True)
class Table:
    """One TOML table (or array of tables) of a configuration file and its leaf fields."""

    key: str  # dotted key of the table, "" for the top level
    array: bool  # [[key]]: a list of such tables
    optional: bool  # absent unless given (a `Struct | None` field)
    description: str
    fields: tuple[Field, ...]

    @property
    def heading(self) -> str:
        """How TOML spells the table: ``[serving]``, ``[[trajectories]]``, or top-level keys."""
        if not self.key:
            return "Top-level keys"
        return f"[[{self.key}]]" if self.array else f"[{self.key}]"


def tables(kind: type[Any]) -> list[Table]:
    """Every table of the Struct ``kind``, depth first, each with its leaf fields."""
    return list(_walk(mi.type_info(kind), key="", array=False, optional=False, description=_doc(kind)))


def _walk(info: mi.Type, *, key: str, array: bool, optional: bool, description: str) -> Iterator[Table]:
    assert isinstance(info, mi.StructType)
    docs = {doc.name: doc for doc in fields_of(info.cls)}  # what --help shows of each field
    leaves: list[Field] = []
    nested: list[tuple[msgspec.inspect.Field, mi.StructType, bool, bool]] = []
    for field in info.fields:
        inner, is_array, is_optional = _section(field.type)
        if inner is not None:
            nested.append((field, inner, is_array, is_optional))
        else:
            leaves.append(_field(field, docs[field.name], key))
    yield Table(key, array, optional, description, tuple(leaves))
    for field, inner, is_array, is_optional in nested:
        text = docs[field.name].description or _doc(inner.cls)
        yield from _walk(
            inner, key=_join(key, field.encode_name), array=is_array, optional=is_optional, description=text
        )


def _section(info: mi.Type) -> tuple[mi.StructType | None, bool, bool]:
    """The Struct a field holds as a table (or list of tables), whether a list, whether optional."""
    info = _bare(info)
    optional = False
    if isinstance(info, mi.UnionType):
        kinds = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(kinds) != 1:
            return None, False, False
        info, optional = _bare(kinds[0]), True
    if isinstance(info, mi.StructType):
        return info, False, optional
    if isinstance(info, mi.ListType | mi.VarTupleType) and isinstance(item := _bare(info.item_type), mi.StructType):
        return item, True, optional
    return None, False, False


def _field(field: msgspec.inspect.Field, doc: FieldDoc, table: str) -> Field:
    return Field(
        key=_join(table, field.encode_name),
        name=field.encode_name,
        type_text=doc.type_text,
        default="required" if doc.required else "not set" if doc.default is None else f"`{_toml(doc.default)}`",
        constraints=", ".join(_constraints(field.type)),
        description=doc.description,
    )


def _join(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


def _bare(info: mi.Type) -> mi.Type:
    while isinstance(info, mi.Metadata):
        info = info.type
    return info


def _doc(cls: type[Any]) -> str:
    """The first paragraph of a Struct's docstring, without the table name it may start with."""
    text = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    return re.sub(r"^``\[+[\w.]+\]+``: ", "", text)


def _constraints(info: mi.Type) -> Iterator[str]:
    """The bounds of a field, its list's items, a union's members (``int ≥ 1 or "auto"``)."""
    info = _bare(info)
    for attr, text in _BOUNDS.items():
        value = getattr(info, attr, None)
        if value is not None:
            yield text.format(value)
    if isinstance(info, mi.ListType | mi.VarTupleType):
        yield from (f"each {bound}" for bound in _constraints(info.item_type))
    elif isinstance(info, mi.DictType):
        yield from (f"each value {bound}" for bound in _constraints(info.value_type))
    elif isinstance(info, mi.UnionType):
        for member in info.types:
            yield from _constraints(member)


def _toml(value: Any) -> str:
    """A default as it would be written in the TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def markdown(title: str, intro: str, kind: type[Any], *, flag_of: Callable[[Field], str | None] | None = None) -> str:
    """The reference page of one configuration file.

    Args:
        title: The page title.
        intro: Markdown shown under the title.
        kind: The file's Struct.
        flag_of: A field's command-line flag, if it has one (adds a column).
    """
    lines = [f"# {title}", "", intro, ""]
    for table in tables(kind):
        if not table.fields and not table.key:
            continue
        lines += [f"## `{table.heading}`" if table.key else f"## {table.heading}", ""]
        if table.description:
            lines += [table.description, ""]
        if table.optional:
            lines += ["Optional: without this table, what it configures is off.", ""]
        if not table.fields:
            continue
        head = ["key", "type", "default", "constraints", "description"]
        if flag_of is not None:
            head.insert(3, "flag")
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for field in table.fields:
            cells = [f"`{field.name}`", field.type_text, field.default, field.constraints, field.description]
            if flag_of is not None:
                flag = flag_of(field)
                cells.insert(3, f"`{flag}`" if flag else "")
            lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)
