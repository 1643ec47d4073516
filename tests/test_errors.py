"""servo's one error tree: every exception class of the package is a `servo.ServoError`, keeps the
builtin base callers catch, and every error a public call documents is exported as ``servo.X``.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import servo
import servo._core
from servo.errors import ServoError

PACKAGE = Path(servo.__file__).parent
BUILTIN_ERRORS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def servo_modules() -> Iterator[ModuleType]:
    """Every module of the package; one that needs a missing optional dependency is left to the static check."""
    yield servo._core
    for info in pkgutil.walk_packages(servo.__path__, "servo."):
        try:
            yield importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "servo":
                raise


def servo_exceptions() -> set[type[BaseException]]:
    return {
        value
        for module in servo_modules()
        for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith("servo")
    }


def test_every_exception_class_of_the_package_is_a_servo_error() -> None:
    found = servo_exceptions()
    assert {servo.ClientError, servo.WireError, servo._core.HeaderError, servo.RobotFault} <= found
    assert sorted(f"{e.__module__}.{e.__qualname__}" for e in found if not issubclass(e, ServoError)) == []


def test_no_class_in_the_source_derives_from_a_builtin_error_alone() -> None:
    # The static twin of the walk above: it also sees modules whose optional dependency is missing.
    alone = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            bases = [ast.unparse(base) for base in node.bases] if isinstance(node, ast.ClassDef) else []
            if bases and set(bases) <= BUILTIN_ERRORS and node.name != "ServoError":
                alone.append(f"{path.relative_to(PACKAGE)}: {node.name}({', '.join(bases)})")
    assert alone == []


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (servo.ConfigError, ValueError),
        (servo.WireError, ValueError),
        (servo.PolicyLoadError, ValueError),
        (servo.IdentityError, ValueError),
        (servo.RequestTimeout, TimeoutError),
        (servo.SendFailed, TimeoutError),
        (servo.EdgeStartError, RuntimeError),
        (servo.PolicyOutputError, RuntimeError),
        (servo.RobotFault, RuntimeError),
        (servo.CameraError, RuntimeError),
        (servo._core.QueueError, ValueError),
        (servo._core.AuthError, ValueError),
    ],
)
def test_an_error_keeps_the_builtin_base_callers_catch(error: type[Exception], builtin: type[Exception]) -> None:
    assert issubclass(error, builtin)
    assert issubclass(error, ServoError)


def test_the_categories_say_what_went_wrong() -> None:
    assert issubclass(servo.UntrustedServer, servo.NoServerFound)
    assert issubclass(servo.UntrustedServer, servo.SecurityError)
    assert issubclass(servo.RogueServer, servo.SecurityError)
    assert issubclass(servo.SessionLost, servo.ClientError)
    assert issubclass(servo.WireError, servo.ProtocolError)
    assert issubclass(servo.PolicyOutputError, servo.PolicyError)
    assert issubclass(servo.CalibrationError, servo.RobotError)
    assert issubclass(servo.EdgeStartError, servo.StartError)


def test_what_the_rust_core_raises_is_a_servo_error() -> None:
    with pytest.raises(servo.ProtocolError, match="attachment is 1 bytes, expected 62"):
        servo._core.decode_header(b"x")
    with pytest.raises(servo.SecurityError, match="32"):
        servo._core.SessionKey(b"short", role="client")
    queue = servo._core.ActionQueue(6, rtc=False)
    with pytest.raises(ServoError, match="expected"):
        queue.merge(np.zeros((4, 7), np.float32), np.zeros((4, 7), np.float32), 0)


def public_callables() -> Iterator[tuple[str, Any]]:
    """Every public name of ``servo``, and every public method and property of its classes."""
    for name in servo.__all__:
        value = getattr(servo, name)
        yield name, value
        if inspect.isclass(value) and not issubclass(value, BaseException):
            for member, attr in inspect.getmembers_static(value):
                function = attr.fget if isinstance(attr, property) else inspect.unwrap(getattr(attr, "__func__", attr))
                if (not member.startswith("_") or member == "__init__") and is_servos(function):
                    yield f"{name}.{member}", function


def is_servos(value: Any) -> bool:
    return str(getattr(value, "__module__", None)).startswith("servo")


def documented_raises(doc: str | None) -> list[str]:
    """The error names of a Google-style ``Raises:`` section (``A, B: why`` names two)."""
    names: list[str] = []
    lines = inspect.cleandoc(doc or "").splitlines()
    for index, line in enumerate(lines):
        if line.strip() != "Raises:":
            continue
        indent = len(lines[index + 1]) - len(lines[index + 1].lstrip()) if index + 1 < len(lines) else 0
        for entry in lines[index + 1 :]:
            if entry.strip() and len(entry) - len(entry.lstrip()) < indent:
                break
            if len(entry) - len(entry.lstrip()) == indent and ":" in entry:
                names += re.findall(r"[A-Za-z_][\w.]*", entry.split(":")[0])
    return names


def test_every_error_a_public_call_documents_is_exported() -> None:
    errors = {e.__name__: e for e in servo_exceptions()}
    unknown, hidden = [], []
    for where, value in public_callables():
        for name in documented_raises(getattr(value, "__doc__", None)):
            short = name.split(".")[-1]
            if short in BUILTIN_ERRORS or name == "zenoh.ZError":
                continue
            if short not in errors:
                unknown.append(f"{where}: {name}")
            elif getattr(servo, short, None) is not errors[short]:
                hidden.append(f"{where}: {name}")
    assert unknown == []  # a documented error that no longer exists
    assert hidden == []  # raised by a public call, so servo.X


def test_the_errors_the_issue_found_unexported_are_exported() -> None:
    for name in ("UntrustedServer", "IdentityError", "PolicyOutputError", "RobotFault", "ServoError"):
        assert name in servo.__all__
        assert issubclass(getattr(servo, name), ServoError)
