"""servo.config: one spelling for every configuration Struct, sections, and keys that moved."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar

import msgspec
import msgspec.inspect as mi
import pytest

from servo.config import ConfigError, PositiveInt, Seconds, convert, doc, fields_of, flag_keys, nest
from servo.deploy.ray import RayOptions
from servo.edge.config import EdgeConfig
from servo.edge.control_process import ControlSpec
from servo.edge.display import DisplayConfig
from servo.monitor import MonitorConfig
from servo.policy.lerobot_checkpoint import LeRobotOptions
from servo.robots import SimOptions, SOFollowerOptions
from servo.router.fleet import Fleet
from servo.server.manifest import Manifest

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "servo"
#: Every configuration surface a user (or the edge's control process) writes.
CONFIGURATION = [
    EdgeConfig,
    Manifest,
    Fleet,
    RayOptions,
    LeRobotOptions,
    SimOptions,
    SOFollowerOptions,
    DisplayConfig,
    MonitorConfig,
]


def structs(kind: type[Any]) -> list[mi.StructType]:
    """``kind`` and every Struct nested in it."""
    found: dict[type[Any], mi.StructType] = {}

    def walk(info: mi.Type) -> None:
        while isinstance(info, mi.Metadata):
            info = info.type
        if isinstance(info, mi.StructType) and info.cls not in found:
            found[info.cls] = info
            for field in info.fields:
                walk(field.type)
        elif isinstance(info, mi.UnionType):
            for member in info.types:
                walk(member)
        elif isinstance(info, mi.ListType | mi.VarTupleType):
            walk(info.item_type)
        elif isinstance(info, mi.DictType):
            walk(info.value_type)

    walk(mi.type_info(kind))
    return list(found.values())


@pytest.mark.parametrize("kind", [*CONFIGURATION, ControlSpec], ids=lambda kind: kind.__name__)
def test_every_option_of_every_configuration_says_what_it_is(kind: type[Any]) -> None:
    for info in structs(kind):
        tables = {field.name for field in info.fields if structs_in(field.type)}  # described by their class
        for field in fields_of(info.cls):
            assert field.description or field.name in tables, f"{info.cls.__name__}.{field.name}"


def structs_in(info: mi.Type) -> bool:
    """Whether a field's values are tables (a Struct, a list of them, or an optional one)."""
    while isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.UnionType):
        return any(structs_in(member) for member in info.types)
    if isinstance(info, mi.ListType):
        return structs_in(info.item_type)
    return isinstance(info, mi.StructType)


def test_constraints_are_spelled_through_the_shared_types_and_doc() -> None:
    # A bound is declared once (servo.config's types) and a field says it with doc(); a raw
    # msgspec.Meta on a configuration field is the second spelling the issue removed. (Wire
    # schemas bound hostile input, not configuration: servo.wire keeps its own aliases.)
    raw = re.compile(r"^\s+\w+: Annotated\[.*msgspec\.Meta\(", re.M)
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.parent.name != "wire" and raw.search(path.read_text())
    ]
    assert offenders == []


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    timeout_s: Annotated[Seconds, doc("A timeout (s).")] = 1.0


class _Sectioned(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    moved_keys: ClassVar[dict[str, str]] = {"timeout_s": "net.timeout_s"}

    retries: Annotated[PositiveInt, doc("Attempts.")] = 3
    net: Annotated[_Section, doc("The network.")] = msgspec.field(default_factory=_Section)


def test_a_moved_key_names_its_new_section_and_a_section_key_is_checked_in_place() -> None:
    with pytest.raises(ConfigError) as info:
        convert({"timeout_s": 2.0}, _Sectioned, origin="app.toml")
    assert str(info.value) == "app.toml: timeout_s moved: use [net] timeout_s"
    with pytest.raises(ConfigError) as info:
        convert({"net": {"timeout_s": 0}}, _Sectioned, origin="app.toml")
    assert str(info.value) == "app.toml: net.timeout_s = 0: expected float > 0.0"
    assert convert(nest({"net.timeout_s": 2.5, "retries": 1}), _Sectioned).net.timeout_s == 2.5


def test_flag_keys_map_each_option_to_its_dotted_key_and_refuse_a_name_in_two_sections() -> None:
    assert flag_keys(_Sectioned) == {"retries": "retries", "timeout_s": "net.timeout_s"}

    class Twice(msgspec.Struct, frozen=True):
        timeout_s: float = 1.0
        net: _Section = msgspec.field(default_factory=_Section)

    with pytest.raises(ValueError, match=r"'timeout_s' is both timeout_s and net\.timeout_s"):
        flag_keys(Twice)
