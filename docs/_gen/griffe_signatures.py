"""A griffe extension for the API reference: signatures show values and public names.

A default written as a name shows as its value. The code names a default once and
shares it (``sepp_lite.sync.SeppClient.connect`` takes ``rpc_timeout: Duration =
_connect_defaults.RPC_TIMEOUT``, as the async ``connect`` does), so the source stays one
source of truth; a reader of the reference wants ``timedelta(seconds=30)``, and a
private name is one they cannot look up. A default that is a name or a dotted name
(``_DEFAULT_LEASE_S``, ``_coalesce.DEFAULT_MAX_IN_FLIGHT``, ``DEFAULT_LOOKAHEAD``) whose
value is a plain one (None, a bool, a number, a str, a timedelta, or a tuple of these)
is replaced by that value, looked up in the module that defines the function or class.
Any other default keeps its expression: a value such as ``RetryDirective.DEFAULT`` reads
best by its public name.

A parameter whose name starts with ``_`` and that has a default is not for callers
(``JobCtx``'s ``_lease``, which sepp-py's constructor has too, is set by the client):
it is left out. tests/test_docs.py fails when a signature of a documented name still
shows a private name.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import griffe

_MISSING = object()
# The largest unit that divides a timedelta evenly names it: timedelta(hours=24), not
# timedelta(days=1) from repr's days/seconds/microseconds split.
_UNITS = (("hours", 3600), ("minutes", 60), ("seconds", 1))


def plain(value: Any) -> str | None:
    """The value as Python source, or None when it is not a plain value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, timedelta):
        return _timedelta(value)
    if isinstance(value, tuple):
        parts = [plain(item) for item in value]
        if any(part is None for part in parts):
            return None
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"  # type: ignore[arg-type]
    return None


def _timedelta(value: timedelta) -> str:
    micros = value // timedelta(microseconds=1)
    if micros % 1_000_000:
        return f"timedelta(seconds={value.total_seconds()!r})"
    seconds = micros // 1_000_000
    for unit, size in _UNITS:
        if seconds % size == 0:
            return f"timedelta({unit}={seconds // size})"
    raise AssertionError("seconds divide by 1")  # pragma: no cover


def _dotted(expr: object) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything but a (dotted) name."""
    if isinstance(expr, griffe.ExprName):
        return [expr.name]
    if isinstance(expr, griffe.ExprAttribute):
        parts = [_dotted(value) for value in expr.values]
        if any(part is None for part in parts):
            return None
        return [name for part in parts for name in part]  # type: ignore[union-attr]
    return None


def value_of(expr: object, module: str) -> str | None:
    """The plain value of a (dotted) name in ``module``, or None."""
    names = _dotted(expr)
    if names is None:
        return None
    found: Any = vars(importlib.import_module(module)).get(names[0], _MISSING)
    for name in names[1:]:
        found = getattr(found, name, _MISSING)
    return None if found is _MISSING else plain(found)


def public_parameters(function: griffe.Function) -> None:
    """Leave out the private parameters with a default; show defaults as values."""
    params = function.parameters
    for name in [p.name for p in params if p.name.startswith("_") and p.default is not None]:
        del function.parameters[name]
    for parameter in function.parameters:
        if parameter.default is not None and not isinstance(parameter.default, str):
            value = value_of(parameter.default, function.module.path)
            if value is not None:
                parameter.default = value


class PublicSignatures(griffe.Extension):
    """Runs on each function and attribute once the package is whole: after griffe's
    dataclasses extension has made each dataclass's ``__init__`` from its fields."""

    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for function in [func, *(func.overloads or [])]:
            public_parameters(function)

    def on_attribute(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        if attr.value is not None:
            attr.value = value_of(attr.value, attr.module.path) or attr.value
