"""Python values to JSON values and back, for one type annotation, with the standard
library only.

``converter(tp)`` compiles a pair of functions once, when a task is registered, so a
job pays for no ``typing`` introspection: ``dump`` checks a value against the type
and returns plain JSON data (dict, list, str, int, float, bool, None); ``load`` checks
JSON data against the type and builds the value (dataclasses, TypedDicts, enums,
datetimes, dates, UUIDs, decimals, bytes as base64, lists, tuples, sets, dicts (bare
ones as of ``Any``), Optional/Union, Literal; pydantic models and msgspec Structs
through their own libraries when the type is one). A mismatch raises :class:`InputError`, whose path
is collected while the error unwinds (``.items[2].qty``), so a value that fits costs
no path bookkeeping.

Objects ignore keys they do not know (a newer producer may send more fields); a
field without a default must be present.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import sys
import types
import typing
import uuid
from collections.abc import (
    Iterable,
    Mapping,
    MutableMapping,
    MutableSequence,
    MutableSet,
    Sequence,
)
from collections.abc import Set as AbstractSet
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, NamedTuple

__all__ = ["Converter", "InputError", "converter", "is_union", "type_name", "unwrap"]

Fn = Callable[[Any], Any]


class InputError(ValueError):
    """A value that does not fit its type. ``problem`` says what is wrong, ``path``
    where (``.items[2].qty``, empty for the value itself); ``str()`` gives both."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self._parts: list[str] = []  # innermost first, appended while unwinding

    def at(self, part: str) -> InputError:
        """Record that the problem is inside ``part`` (``.name`` or ``[index]``)."""
        self._parts.append(part)
        return self

    @property
    def path(self) -> str:
        return "".join(reversed(self._parts))

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self._parts else self.problem


class Converter(NamedTuple):
    dump: Fn  # value -> JSON data
    load: Fn  # JSON data -> value


def type_name(tp: Any) -> str:
    """How a type reads in messages: ``int``, ``list[Item]``, ``Optional[str]``."""
    if isinstance(tp, type) and typing.get_origin(tp) is None:  # list[int] is a type before 3.11
        return tp.__name__
    return str(tp).replace("typing.", "")


def _got(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _mismatch(expected: str, value: object) -> InputError:
    return InputError(f"expected {expected}, got {_got(value)}")


def converter(tp: Any) -> Converter:
    """The converter of ``tp``; ``TypeError`` naming what cannot be converted."""
    return _compile(tp, {})


# -- dispatch ---------------------------------------------------------------------------


# TypedDict key qualifiers (Python 3.11+): the type inside is what travels.
_QUALIFIERS = {getattr(typing, name, None) for name in ("Required", "NotRequired", "ReadOnly")}
_QUALIFIERS.discard(None)


def unwrap(tp: Any) -> Any:
    """``tp`` without what does not change what travels: ``Annotated``, TypedDict key
    qualifiers, ``NewType`` (its supertype); a ``TypeVar`` is ``Any``."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated or (origin is not None and origin in _QUALIFIERS):
            tp = typing.get_args(tp)[0]
        elif hasattr(tp, "__supertype__"):  # typing.NewType
            tp = tp.__supertype__
        elif isinstance(tp, typing.TypeVar):
            tp = Any
        else:
            return tp


def _compile(tp: Any, memo: dict[Any, Converter]) -> Converter:
    tp = unwrap(tp)
    if isinstance(tp, (str, typing.ForwardRef)):  # input_type="Order", list["Order"]
        name = tp if isinstance(tp, str) else tp.__forward_arg__
        raise TypeError(f"{name!r} is the name of a type, not a type: pass the type itself")
    try:
        known = memo.get(tp)
    except TypeError:  # an unhashable annotation (a Literal of a list, say)
        known = None
    if known is not None:
        return known
    origin = typing.get_origin(tp)
    if origin is not None:
        return _compile_generic(tp, origin, typing.get_args(tp), memo)
    if isinstance(tp, type) and tp in _CONTAINERS:  # bare: as if of Any
        return _compile_generic(tp, tp, (), memo)
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        return scalar
    for test, build in _CLASSES:
        if isinstance(tp, type) and test(tp):
            return _recursive(tp, memo, build)
    raise _uncarried(tp)


def _uncarried(tp: Any) -> TypeError:
    return TypeError(
        f"{type_name(tp)} cannot be carried as JSON by sepp_lite.tasks (give the task a "
        "codec= for it)"
    )


def _recursive(
    tp: type, memo: dict[Any, Converter], build: Callable[[Any, dict[Any, Converter]], Converter]
) -> Converter:
    """Compile a class that may refer to itself (a tree of nodes): while it is being
    compiled, references to it go through a cell that holds the result later."""
    cell: list[Converter] = []
    memo[tp] = Converter(lambda v: cell[0].dump(v), lambda v: cell[0].load(v))
    compiled = build(tp, memo)
    cell.append(compiled)
    memo[tp] = compiled
    return compiled


# -- scalars ----------------------------------------------------------------------------


def _exact(kind: type, check: Callable[[Any], bool]) -> Converter:
    name = kind.__name__

    def same(value: Any) -> Any:
        if check(value):
            return value
        raise _mismatch(name, value)

    return Converter(same, same)


def _to_float(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise _mismatch("float", value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _null(value: Any) -> None:
    if value is not None:
        raise _mismatch("null", value)


def _any(value: Any) -> Any:
    return value


def _text_type(
    kind: type, parse: Callable[[str], Any], show: Callable[[Any], str], wrong: str
) -> Converter:
    """A type carried as a JSON string (UUID, datetime, date, bytes as base64); ``wrong``
    is the problem of a string that does not parse, with ``{!r}`` for the string."""
    name = kind.__name__
    text = "a base64 string" if kind is bytes else "a string"

    def dump(value: Any) -> str:
        if isinstance(value, kind) and not (kind is date and isinstance(value, datetime)):
            return show(value)
        raise _mismatch(name, value)

    def load(value: Any) -> Any:
        if not isinstance(value, str):
            raise _mismatch(f"{name} as {text}", value)
        try:
            return parse(value)
        except (ValueError, TypeError, binascii.Error):
            raise InputError(wrong.format(value)) from None

    return Converter(dump, load)


def _parse_datetime(text: str) -> datetime:
    # fromisoformat reads "Z" only from Python 3.11 on.
    if text[-1:] in ("Z", "z"):
        return datetime.fromisoformat(text[:-1]).replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(text)


def _parse_date(text: str) -> date:
    return date.fromisoformat(text)


def _load_decimal(value: Any) -> Decimal:
    if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        try:
            return Decimal(value if isinstance(value, (str, int)) else repr(value))
        except (InvalidOperation, ValueError):
            raise InputError(f"not a valid Decimal: {value!r}") from None
    raise _mismatch("Decimal", value)


def _dump_decimal(value: Any) -> str:
    if isinstance(value, Decimal):
        return str(value)
    raise _mismatch("Decimal", value)


_SCALARS: dict[Any, Converter] = {
    str: _exact(str, lambda v: isinstance(v, str)),
    bool: _exact(bool, lambda v: v is True or v is False),
    int: _exact(int, _is_int),
    float: Converter(_to_float, _to_float),
    type(None): Converter(_null, _null),
    None: Converter(_null, _null),
    Any: Converter(_any, _any),
    object: Converter(_any, _any),
    uuid.UUID: _text_type(uuid.UUID, uuid.UUID, str, "not a valid UUID: {!r}"),
    # Before Python 3.11 fromisoformat reads only what isoformat writes: say that much.
    datetime: _text_type(
        datetime,
        _parse_datetime,
        datetime.isoformat,
        "expected a datetime as datetime.isoformat() writes it (Z for UTC too), got {!r}",
    ),
    date: _text_type(
        date,
        _parse_date,
        date.isoformat,
        "expected a date as date.isoformat() writes it (YYYY-MM-DD), got {!r}",
    ),
    bytes: _text_type(
        bytes,
        lambda s: base64.b64decode(s, validate=True),
        lambda b: base64.b64encode(b).decode("ascii"),
        "not valid base64: {!r}",
    ),
    Decimal: Converter(_dump_decimal, _load_decimal),
}


# -- containers -------------------------------------------------------------------------

# typing.List[int] and list[int] have the same origin, list (and so on).
_LISTS = {list, Sequence, MutableSequence, Iterable}
_SETS = {set: set, frozenset: frozenset, AbstractSet: set, MutableSet: set}
_DICTS = {dict, Mapping, MutableMapping}
# Written bare (list, dict, typing.Tuple has an origin), each is its form of Any.
_CONTAINERS = {*_LISTS, *_SETS, *_DICTS, tuple}


def _compile_generic(
    tp: Any, origin: Any, args: tuple[Any, ...], memo: dict[Any, Converter]
) -> Converter:
    if is_union(origin):
        return _union(tp, args, memo)
    if origin is typing.Literal:
        return _literal(args)
    if origin in _LISTS:
        return _sequence(_item(args, memo), list)
    if origin in _SETS:
        return _sequence(_item(args, memo), _SETS[origin])
    if origin is tuple:
        return _tuple(tp, args, memo)
    if origin in _DICTS:
        return _mapping(args, memo)
    if dataclasses.is_dataclass(origin):
        raise TypeError(f"{type_name(tp)}: generic dataclasses are not supported")
    raise _uncarried(tp)


def is_union(origin: Any) -> bool:
    """Whether ``origin`` (``typing.get_origin`` of a type) is a union: ``Union[...]``,
    ``Optional[...]`` or ``X | Y``."""
    return origin is typing.Union or origin is getattr(types, "UnionType", typing.Union)


def _item(args: tuple[Any, ...], memo: dict[Any, Converter]) -> Converter:
    return _compile(args[0], memo) if args else _SCALARS[Any]


def _find_index(items: Iterable[Any], convert: Fn, error: InputError) -> InputError:
    """Which item failed (looked for again only once one did)."""
    for index, item in enumerate(items):
        try:
            convert(item)
        except InputError as found:
            return found.at(f"[{index}]")
    return error


def _sequence(item: Converter, kind: type) -> Converter:
    """A list, tuple or set of ``item``: any of those when dumping, a JSON list when
    loading."""
    dump_item, load_item = item
    what = f"a {kind.__name__}"
    listed = "a list" if kind in (list, tuple) else f"a list (for {what})"

    def dump(value: Any) -> list[Any]:
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise _mismatch(what, value)
        try:
            return [dump_item(v) for v in value]
        except InputError as error:
            raise _find_index(value, dump_item, error) from None

    def load(value: Any) -> Any:
        if not isinstance(value, list):
            raise _mismatch(listed, value)
        try:
            items = [load_item(v) for v in value]
        except InputError as error:
            raise _find_index(value, load_item, error) from None
        if kind is list:
            return items
        try:
            return kind(items)
        except TypeError as exc:  # a set of items that cannot be in one (lists, dicts)
            raise _find_index(items, _hashable, InputError(str(exc))) from None

    return Converter(dump, load)


def _hashable(value: Any) -> None:
    try:
        hash(value)
    except TypeError:
        raise _mismatch("a hashable value", value) from None


def _tuple(tp: Any, args: tuple[Any, ...], memo: dict[Any, Converter]) -> Converter:
    if tp is tuple or tp is typing.Tuple:  # noqa: UP006 - bare: as tuple[Any, ...]
        args = (Any, ...)
    elif args == ((),):  # tuple[()] before Python 3.11
        args = ()
    if len(args) == 2 and args[1] is Ellipsis:
        return _sequence(_compile(args[0], memo), tuple)
    items = [_compile(arg, memo) for arg in args]

    def convert(value: Any, dumping: bool) -> Any:
        if not isinstance(value, (tuple, list)):
            raise _mismatch(f"a list of {len(items)} items", value)
        if len(value) != len(items):
            raise InputError(
                f"expected a list of {len(items)} items, got a {type(value).__name__} "
                f"of {len(value)}"
            )
        out = []
        for index, (conv, element) in enumerate(zip(items, value)):
            try:
                out.append(conv.dump(element) if dumping else conv.load(element))
            except InputError as error:
                raise error.at(f"[{index}]") from None
        return out if dumping else tuple(out)

    return Converter(lambda v: convert(v, True), lambda v: convert(v, False))


def _key(tp: Any) -> Converter:
    """JSON object keys are strings: str keys as they are, int keys as decimals, and
    enums, UUIDs and dates as their string forms."""
    tp = unwrap(tp)
    if tp is str or tp is Any:
        return _SCALARS[str]
    if tp is int:

        def load_int(key: str) -> int:
            try:
                return int(key)
            except ValueError:
                raise InputError("not an integer") from None

        return Converter(lambda k: str(_SCALARS[int].dump(k)), load_int)
    if tp in (uuid.UUID, date, datetime) or (
        isinstance(tp, type) and issubclass(tp, enum.Enum) and _all_str(tp)
    ):
        return _compile(tp, {})
    raise TypeError(
        f"dict keys of type {type_name(tp)} cannot be carried as JSON object keys by "
        "sepp_lite.tasks (keys may be str, int, a str-valued Enum, UUID, date or datetime)"
    )


def _all_str(tp: type[enum.Enum]) -> bool:
    return all(isinstance(member.value, str) for member in tp)


def _mapping(args: tuple[Any, ...], memo: dict[Any, Converter]) -> Converter:
    key = _key(args[0]) if args else _SCALARS[str]
    value_conv = _compile(args[1], memo) if len(args) > 1 else _SCALARS[Any]

    def convert(value: Any, dumping: bool) -> dict[Any, Any]:
        if not isinstance(value, Mapping if dumping else dict):
            raise _mismatch("an object", value)
        convert_key = key.dump if dumping else key.load
        convert_value = value_conv.dump if dumping else value_conv.load
        out = {}
        k: Any = None
        try:
            for k, v in value.items():
                out[convert_key(k)] = convert_value(v)
        except InputError as error:
            raise _entry_error(error, k, convert_key) from None
        return out

    return Converter(lambda v: convert(v, True), lambda v: convert(v, False))


def _entry_error(error: InputError, key: Any, convert_key: Fn) -> InputError:
    """The error of one entry of an object: its key's, said so (a path would point at
    its value), or its value's, located at the key."""
    try:
        convert_key(key)
    except InputError as key_error:
        return InputError(f"key {key!r}: {key_error.problem}")
    return error.at(f"[{key!r}]")


def _union(tp: Any, args: tuple[Any, ...], memo: dict[Any, Converter]) -> Converter:
    none = type(None)
    arms = [arg for arg in args if arg is not none]
    if len(arms) == 1 and len(args) == 2:
        return _optional(_compile(arms[0], memo))
    convs = [_compile(arg, memo) for arg in args]
    expected = " | ".join(type_name(arg) if arg is not none else "null" for arg in args)

    def first_fit(value: Any, dumping: bool) -> Any:
        errors = []
        for conv in convs:
            try:
                return conv.dump(value) if dumping else conv.load(value)
            except InputError as error:
                errors.append(error)
        deep = [error for error in errors if error.path]
        if len(deep) == 1:  # only one arm got past the value's kind: its error says most
            raise deep[0]
        raise _mismatch(expected, value)

    return Converter(lambda v: first_fit(v, True), lambda v: first_fit(v, False))


def _optional(inner: Converter) -> Converter:
    dump_inner, load_inner = inner
    return Converter(
        lambda v: None if v is None else dump_inner(v),
        lambda v: None if v is None else load_inner(v),
    )


def _literal(values: tuple[Any, ...]) -> Converter:
    def check(value: Any) -> Any:
        for allowed in values:
            if value == allowed and type(value) is type(allowed):
                return value
        raise InputError(f"expected one of {list(values)!r}, got {value!r}")

    return Converter(check, check)


# -- classes ----------------------------------------------------------------------------


def _hints(tp: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(tp, include_extras=True)
    except NameError as exc:
        raise TypeError(
            f"cannot resolve the annotations of {tp.__qualname__} ({exc}): the names they "
            f"use must be defined at the top level of its module, {tp.__module__}"
        ) from None


def _enum(tp: Any, memo: dict[Any, Converter]) -> Converter:
    by_value = {member.value: member for member in tp}
    allowed = list(by_value)

    def dump(value: Any) -> Any:
        if isinstance(value, tp):
            return value.value
        raise _mismatch(tp.__name__, value)

    def load(value: Any) -> Any:
        try:
            member = by_value[value]
        except (KeyError, TypeError):
            member = None
        if member is None or type(member.value) is not type(value):
            raise InputError(f"expected one of {allowed!r}, got {value!r}")
        return member

    return Converter(dump, load)


class _Field(NamedTuple):
    name: str
    dump: Fn
    load: Fn
    required: bool


def _dataclass(tp: Any, memo: dict[Any, Converter]) -> Converter:
    hints = _hints(tp)
    fields = []
    for f in dataclasses.fields(tp):
        if not f.init:
            continue
        conv = _compile(hints.get(f.name, Any), memo)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append(_Field(f.name, conv.dump, conv.load, required))
    return Converter(_dump_object(tp, fields), _load_object(tp, fields))


def _dump_object(tp: type, fields: list[_Field]) -> Fn:
    def dump(value: Any) -> dict[str, Any]:
        if not isinstance(value, tp):
            raise _mismatch(tp.__name__, value)
        out = {}
        name = ""
        try:
            for name, dump_field, _, _ in fields:
                out[name] = dump_field(getattr(value, name))
        except InputError as error:
            raise error.at(f".{name}") from None
        return out

    return dump


def _load_object(tp: type, fields: list[_Field]) -> Fn:
    what = f"an object ({tp.__name__})"

    def load(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _mismatch(what, value)
        kwargs = {}
        name = ""
        try:
            for name, _, load_field, required in fields:
                if name in value:
                    kwargs[name] = load_field(value[name])
                elif required:
                    raise InputError("missing")
        except InputError as error:
            raise error.at(f".{name}") from None
        try:
            return tp(**kwargs)
        except (TypeError, ValueError) as exc:  # its __post_init__ refused the values
            raise InputError(f"{tp.__name__}: {exc}") from None

    return load


def _is_typeddict(tp: type) -> bool:
    return issubclass(tp, dict) and hasattr(tp, "__total__") and hasattr(tp, "__required_keys__")


def _required(tp: Any, name: str, hint: Any) -> bool:
    # With string annotations (from __future__ import annotations) the class cannot
    # see NotRequired[...] when it is made, so its __required_keys__ may be wrong.
    qualifier = str(getattr(typing.get_origin(hint), "_name", ""))
    if qualifier in ("Required", "NotRequired"):
        return qualifier == "Required"
    return name in set(tp.__required_keys__)


def _typeddict(tp: Any, memo: dict[Any, Converter]) -> Converter:
    hints = _hints(tp)
    fields = [
        _Field(name, conv.dump, conv.load, _required(tp, name, hint))
        for name, hint, conv in ((n, h, _compile(h, memo)) for n, h in hints.items())
    ]

    def convert(value: Any, dumping: bool) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _mismatch(f"an object ({tp.__name__})", value)
        out = {}
        name = ""
        try:
            for name, dump_field, load_field, needed in fields:
                if name in value:
                    out[name] = (dump_field if dumping else load_field)(value[name])
                elif needed:
                    raise InputError("missing")
        except InputError as error:
            raise error.at(f".{name}") from None
        return out

    return Converter(lambda v: convert(v, True), lambda v: convert(v, False))


def pydantic_model(tp: Any) -> bool:
    """Whether ``tp`` is a pydantic (v2) model class; pydantic is not imported here:
    a program that has such a class has imported it already."""
    pydantic = sys.modules.get("pydantic")
    return (
        pydantic is not None
        and isinstance(tp, type)
        and issubclass(tp, pydantic.BaseModel)
        and hasattr(tp, "model_validate")
    )


def msgspec_struct(tp: Any) -> bool:
    """Whether ``tp`` is a ``msgspec.Struct`` class (msgspec is not imported here)."""
    msgspec = sys.modules.get("msgspec")
    return msgspec is not None and isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def pydantic_error(exc: Any) -> InputError:
    """A pydantic ``ValidationError`` located like ours: its first problem, followed
    by the others (up to five) with their paths, so one reason names them all."""
    first, *others = exc.errors()
    problem = first["msg"]
    if others:
        shown = "; ".join(f"{_pydantic_path(e['loc'])}: {e['msg']}" for e in others[:5])
        more = f"; and {len(others) - 5} more" if len(others) > 5 else ""
        problem = f"{problem} (also {shown}{more})"
    error = InputError(problem)
    for part in reversed(first["loc"]):
        error.at(_pydantic_part(part))
    return error


def _pydantic_part(part: Any) -> str:
    return f"[{part}]" if isinstance(part, int) else f".{part}"


def _pydantic_path(loc: Any) -> str:
    return "".join(_pydantic_part(part) for part in loc)


def msgspec_error(exc: Exception) -> InputError:
    """A msgspec ``ValidationError`` ("Expected `int`, got `str` - at `$.a[0]`")."""
    text = str(exc)
    problem, _, where = text.partition(" - at `$")
    error = InputError(problem)
    if where:
        error.at(where.rstrip("`"))
    return error


def _pydantic(tp: Any, memo: dict[Any, Converter]) -> Converter:
    invalid = sys.modules["pydantic"].ValidationError

    def dump(value: Any) -> Any:
        if not isinstance(value, tp):
            raise _mismatch(tp.__name__, value)
        return value.model_dump(mode="json")

    def load(value: Any) -> Any:
        try:
            return tp.model_validate(value)
        except invalid as exc:
            raise pydantic_error(exc) from None

    return Converter(dump, load)


def _msgspec(tp: Any, memo: dict[Any, Converter]) -> Converter:
    msgspec = sys.modules["msgspec"]

    def dump(value: Any) -> Any:
        if not isinstance(value, tp):
            raise _mismatch(tp.__name__, value)
        return msgspec.to_builtins(value)

    def load(value: Any) -> Any:
        try:
            return msgspec.convert(value, tp)
        except msgspec.ValidationError as exc:
            raise msgspec_error(exc) from None

    return Converter(dump, load)


_CLASSES: list[tuple[Callable[[type], bool], Callable[[Any, dict[Any, Converter]], Converter]]] = [
    (lambda tp: issubclass(tp, enum.Enum), _enum),
    (dataclasses.is_dataclass, _dataclass),
    (_is_typeddict, _typeddict),
    (pydantic_model, _pydantic),
    (msgspec_struct, _msgspec),
]
