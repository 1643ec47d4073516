"""The one configuration layer: TOML files, command-line values and option tables as msgspec Structs.

Every configuration surface of servo (server manifest, edge options, robot options, fleet file,
display) is a frozen `msgspec.Struct`. A field is spelled one way: a constrained type declared
once below (`Seconds`, `Port`, `PositiveInt`…) and its one sentence of help, `doc` (a bound that
only one field has goes into `doc` too: ``doc("…", le=10)``)::

    max_offline_s: Annotated[Seconds, doc("Offline this long -> DEAD: park the arm and exit (s).")] = 60.0

Values are converted with `msgspec.convert` and every error is reported the same way, naming the
file and the dotted key::

    manifest.toml: serving.max_sessions = -5: expected int >= 1
    manifest.toml: serving.max_sesions: unknown key (valid: app, max_sessions, mode, …)
    edge.toml: buffer_time_s moved: use [pipeline] buffer_time_s

Unknown and missing keys are found by walking the values against the Struct's fields here, so the
message can list what is valid; type and range errors come from msgspec, whose documented
``- at `$.path``` suffix locates the value.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec
import msgspec.inspect as mi

from servo.errors import ServoError

T = TypeVar("T")

#: Longest value quoted back in an error message (a value is user input: keep lines short).
_MAX_QUOTED = 240


class ConfigError(ServoError, ValueError):
    """A configuration value cannot be used; the message names the file and the dotted key."""


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One configurable field, for help texts: name, type, default and description."""

    name: str
    type_text: str
    default: Any
    required: bool
    description: str
    choices: tuple[Any, ...] = ()


# ---------------------------------------------------------------------------- constrained types
#: A duration in seconds, > 0.
Seconds = Annotated[float, msgspec.Meta(gt=0)]
#: A duration in seconds, >= 0 (0: none, at once).
NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0)]
#: A count or size of at least 1.
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
#: A count of at least 0.
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
#: A rate, factor or size > 0.
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
#: An amount >= 0.
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
#: A share between 0 and 1.
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
#: A TCP port; 0 where the field says what 0 means (disabled, or any free port).
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
#: A control or camera rate (Hz).
Hertz = Annotated[float, msgspec.Meta(gt=0, le=1000)]
#: A JPEG quality (0, raw pixels, is a separate choice where a field offers it).
Quality = Annotated[int, msgspec.Meta(ge=1, le=100)]
#: A Zenoh lease (ms): below 100 ms a busy host declares its peers dead.
LeaseMs = Annotated[int, msgspec.Meta(ge=100)]
#: A message or payload size limit (bytes): at least 1 KiB, so every control message fits.
ByteLimit = Annotated[int, msgspec.Meta(ge=1024)]
#: Text that must not be empty.
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


def doc(text: str, **constraints: Any) -> msgspec.Meta:
    """The one-sentence description of a configuration field, and any bound only it has.

    Used as ``Annotated[Seconds, doc("Staleness bound (s).")]``; shared bounds come from the
    constrained types above, so ``doc`` adds constraints only a single field has
    (``Annotated[PositiveFloat, doc("Scales every joint's velocity limit.", le=10)]``).
    """
    return msgspec.Meta(description=text, **constraints)


def parse_toml(text: str | bytes, kind: type[T], *, origin: str, overrides: Mapping[str, Any] | None = None) -> T:
    """Decode TOML text into ``kind``.

    Args:
        text: The TOML document.
        kind: A msgspec Struct type.
        origin: Named at the start of every error message (usually the file).
        overrides: Values that replace the file's, by dotted key (``{"zenoh.listen": [...]}``):
            command-line flags, checked by the same rules as the file.

    Raises:
        ConfigError: invalid TOML, an unknown or missing key, a wrong type or a value out of range.
    """
    data = text.encode() if isinstance(text, str) else text
    try:
        values = msgspec.toml.decode(data)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{origin}: invalid TOML: {exc}") from None
    return convert(nest(overrides or {}, into=values), kind, origin=origin)


def nest(values: Mapping[str, Any], *, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dotted keys as tables (``{"a.b": 1}`` -> ``{"a": {"b": 1}}``), replacing those of ``into`` if given."""
    out: dict[str, Any] = {} if into is None else into
    for key, value in values.items():
        *sections, leaf = key.split(".")
        table = out
        for section in sections:
            table = table.setdefault(section, {})
        table[leaf] = value
    return out


def load_toml(path: str | Path, kind: type[T], *, overrides: Mapping[str, Any] | None = None) -> T:
    """Read a TOML file into ``kind`` (see `parse_toml`).

    Raises:
        ConfigError: the file cannot be read, or `parse_toml` refuses it.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return parse_toml(data, kind, origin=str(path), overrides=overrides)


def convert(values: Mapping[str, Any], kind: type[T], *, origin: str = "", strict: bool = True) -> T:
    """Convert plain values (from TOML, JSON or the command line) into ``kind``.

    Args:
        values: The raw values.
        kind: A msgspec Struct type.
        origin: File (or ``--flag`` source) named at the start of an error message.
        strict: ``False`` accepts strings for numbers and booleans (command-line values).

    A Struct may name keys that moved (``moved_keys: ClassVar[Mapping[str, str]]``, old key ->
    new dotted key): such a key is refused with ``KEY moved: use [SECTION] KEY``.

    Raises:
        ConfigError: an unknown, moved or missing key, a wrong type or a value out of range.
    """
    prefix = f"{origin}: " if origin else ""
    problem = _key_problem(values, mi.type_info(kind), "")
    if problem is not None:
        raise ConfigError(prefix + problem)
    try:
        result = msgspec.convert(values, kind, strict=strict)
    except msgspec.ValidationError as exc:
        raise ConfigError(prefix + _type_problem(str(exc), values)) from None
    try:
        _check(result, "")
    except _Located as exc:
        found, value = _lookup(values, exc.path)
        shown = f" = {quoted(value)}" if found else ""
        raise ConfigError(f"{prefix}{exc.path}{shown}: {exc.message}") from None
    return result


def fields_of(kind: type[Any]) -> list[FieldDoc]:
    """The fields of a Struct with their type, default and ``Meta(description=…)``."""
    info = mi.type_info(kind)
    assert isinstance(info, mi.StructType)
    out = []
    for f in info.fields:
        default = f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default
        out.append(
            FieldDoc(
                name=f.name,
                type_text=_type_text(f.type),
                default=None if default is msgspec.NODEFAULT else default,
                required=f.required,
                description=_description(f.type),
                choices=_choices(f.type),
            )
        )
    return out


def sections_of(kind: type[Any]) -> dict[str, type[Any]]:
    """The fields of a Struct that are Structs themselves (its TOML tables), by name."""
    info = mi.type_info(kind)
    assert isinstance(info, mi.StructType)
    return {f.name: t.cls for f in info.fields if isinstance(t := _unwrap(f.type), mi.StructType)}


def flag_keys(kind: type[Any]) -> dict[str, str]:
    """The dotted key of every option of a Struct with sections, by the option's own name.

    ``{"buffer_time_s": "pipeline.buffer_time_s", "task": "task", …}``: what lets a flag keep its
    short name (``--buffer-time-s``) while the file nests it.

    Raises:
        ValueError: two sections use the same name (a flag could not tell them apart).
    """
    keys: dict[str, str] = {}
    sections = sections_of(kind)
    for field in fields_of(kind):
        inner = fields_of(sections[field.name]) if field.name in sections else []
        for leaf, key in [(f.name, f"{field.name}.{f.name}") for f in inner] or [(field.name, field.name)]:
            if leaf in keys:
                raise ValueError(f"{kind.__name__}: option {leaf!r} is both {keys[leaf]} and {key}")
            keys[leaf] = key
    return keys


class FieldError(ConfigError):
    """What a Struct's ``check()`` raises about one of its own fields (``field`` relative to it).

    `convert` calls ``check()`` on every Struct of the converted tree that defines it (rules that span
    several fields, or need the file system): a FieldError becomes a `ConfigError` naming the key and value.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def quoted(value: Any) -> str:
    """A value as it may appear in an error message: repr, shortened."""
    text = repr(value)
    return text if len(text) <= _MAX_QUOTED else text[: _MAX_QUOTED - 1] + "…"


# ---------------------------------------------------------------------------- key walk
def _key_problem(values: Any, info: mi.Type, path: str) -> str | None:
    info = _unwrap(info)
    if isinstance(info, mi.StructType) and isinstance(values, Mapping):
        names = {f.encode_name: f for f in info.fields}
        moved: Mapping[str, str] = getattr(info.cls, "moved_keys", {})
        for key in values:
            if key in moved and key not in names:
                section, _, leaf = moved[key].rpartition(".")
                return f"{_join(path, str(key))} moved: use [{_join(path, section)}] {leaf}"
            if key not in names:
                valid = ", ".join(sorted(names))
                return f"{_join(path, str(key))}: unknown key (valid: {valid})"
        for f in info.fields:
            if f.required and f.encode_name not in values:
                return f"{_join(path, f.encode_name)}: required key is missing"
        for key, value in values.items():
            problem = _key_problem(value, names[key].type, _join(path, key))
            if problem is not None:
                return problem
    elif isinstance(info, mi.ListType | mi.TupleType | mi.VarTupleType) and isinstance(values, list | tuple):
        # A fixed tuple types each position (extra values are msgspec's to refuse); the rest, all.
        items = info.item_types if isinstance(info, mi.TupleType) else (info.item_type,) * len(values)
        for i, (value, item) in enumerate(zip(values, items, strict=False)):
            problem = _key_problem(value, item, f"{path}[{i}]")
            if problem is not None:
                return problem
    elif isinstance(info, mi.DictType) and isinstance(values, Mapping):
        for key, value in values.items():
            problem = _key_problem(value, info.value_type, _join(path, str(key)))
            if problem is not None:
                return problem
    return None


def _unwrap(info: mi.Type) -> mi.Type:
    while isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.UnionType):
        # ``Section | None``: walk the section when the value is given.
        structs = [t for t in info.types if isinstance(_unwrap(t), mi.StructType)]
        if len(structs) == 1:
            return _unwrap(structs[0])
    return info


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---------------------------------------------------------------------------- cross-field checks
class _Located(ServoError):
    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message


def _check(node: Any, path: str) -> None:
    if isinstance(node, msgspec.Struct):
        for name in node.__struct_fields__:
            _check(getattr(node, name), _join(path, name))
        check = getattr(node, "check", None)
        if check is not None:
            try:
                check()
            except FieldError as exc:
                raise _Located(_join(path, exc.field), exc.message) from None
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            _check(item, f"{path}[{i}]")
    elif isinstance(node, dict):
        for key, item in node.items():
            _check(item, _join(path, str(key)))


# ---------------------------------------------------------------------------- type errors
def _type_problem(text: str, values: Mapping[str, Any]) -> str:
    message, sep, where = text.rpartition(" - at `")
    if not sep:
        return _plain(text)
    path = where.rstrip("`").removeprefix("$").removeprefix(".")
    found, value = _lookup(values, path)
    shown = f" = {quoted(value)}" if found else ""
    return f"{path or '<top>'}{shown}: {_plain(message)}"


def _plain(message: str) -> str:
    message = message.replace("`", "")
    return message[:1].lower() + message[1:]


def _lookup(values: Any, path: str) -> tuple[bool, Any]:
    current = values
    for part in _split_path(path):
        try:
            current = current[part]
        except (KeyError, IndexError, TypeError):
            return False, None
    return bool(path), current


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for dotted in path.split(".") if path else []:
        name, _, rest = dotted.partition("[")
        if name:
            parts.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            parts.append(int(index))
            rest = rest.removeprefix("[")
    return parts


# ---------------------------------------------------------------------------- help texts
def _description(info: mi.Type) -> str:
    while isinstance(info, mi.Metadata):
        extra = info.extra_json_schema or {}
        if "description" in extra:
            return str(extra["description"])
        info = info.type
    return ""


def _choices(info: mi.Type) -> tuple[Any, ...]:
    info = _unwrap(info)
    if isinstance(info, mi.LiteralType):
        return tuple(info.values)
    return ()


def _type_text(info: mi.Type) -> str:
    info = _unwrap(info)
    names = {
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.StrType: "str",
        mi.BoolType: "bool",
    }
    for cls, name in names.items():
        if isinstance(info, cls):
            return name
    if isinstance(info, mi.LiteralType):
        return "|".join(str(v) for v in info.values)
    if isinstance(info, mi.ListType | mi.VarTupleType):
        return f"list of {_type_text(info.item_type)}"
    if isinstance(info, mi.DictType):
        return f"table of {_type_text(info.value_type)}"
    if isinstance(info, mi.UnionType):
        return " or ".join(_type_text(t) for t in info.types if not isinstance(t, mi.NoneType))
    return "value"


def is_sequence_type(annotation: Any) -> bool:
    """Whether a field annotation is a list/tuple (command-line values are comma-separated)."""
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return any(is_sequence_type(a) for a in get_args(annotation) if a is not type(None))
    if str(origin) == "typing.Annotated" or hasattr(annotation, "__metadata__"):
        return is_sequence_type(get_args(annotation)[0])
    return origin in (list, tuple)
