"""The codecs of sepp_lite.tasks on their own: each annotation's JSON both ways, the
error of a value that does not fit (naming the field's path), and the pydantic and
msgspec codecs (skipped without those libraries, which are not dependencies)."""

from __future__ import annotations

import enum
import sys
import typing
import uuid
from collections import abc
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Generic, Literal, NewType, Optional, TypedDict, TypeVar, Union

import pytest

from sepp_lite.tasks import BytesCodec, InputError, JsonCodec, Tasks, TextCodec
from sepp_lite.tasks._codecs import codec_for

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:
    NotRequired = None


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass
class Qty:
    sku: str
    qty: int


@dataclass
class Cart:
    items: list[Qty]
    owner: Optional[str] = None
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Node:
    name: str
    children: list[Node] = field(default_factory=list)


@dataclass
class Positive:
    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError("n must be positive")


class Address(TypedDict, total=False):
    street: str
    zip: str


class Person(TypedDict):
    name: str
    address: Address


UserId = NewType("UserId", int)
T = TypeVar("T")


def roundtrip(tp: Any, value: Any) -> Any:
    codec = JsonCodec(tp)
    return codec.decode(codec.encode(value))


def load_error(tp: Any, data: bytes) -> str:
    with pytest.raises(InputError) as caught:
        JsonCodec(tp).decode(data)
    return str(caught.value)


@pytest.mark.parametrize(
    ("tp", "value", "wire"),
    [
        (int, 3, b"3"),
        (float, 1.5, b"1.5"),
        (bool, True, b"true"),
        (type(None), None, b"null"),
        (str, "h\u00e9", '"h\u00e9"'.encode()),  # str inside JSON when asked for JSON
        (Optional[int], None, b"null"),
        (list[int], [1, 2], b"[1,2]"),
        (tuple[int, str], (1, "a"), b'[1,"a"]'),
        (tuple[int, ...], (1, 2, 3), b"[1,2,3]"),
        (frozenset[int], frozenset({1}), b"[1]"),
        (abc.Set[int], {1, 2}, b"[1,2]"),  # typing.AbstractSet
        (abc.MutableSet[str], {"a"}, b'["a"]'),
        (dict[int, str], {1: "a"}, b'{"1":"a"}'),
        (dict[Color, int], {Color.RED: 1}, b'{"red":1}'),
        (Color, Color.BLUE, b'"blue"'),
        (Level, Level.HIGH, b"2"),
        (uuid.UUID, uuid.UUID(int=1), b'"00000000-0000-0000-0000-000000000001"'),
        (datetime, datetime(2030, 1, 1, 12, tzinfo=timezone.utc), b'"2030-01-01T12:00:00+00:00"'),
        (date, date(2030, 1, 1), b'"2030-01-01"'),
        (Decimal, Decimal("0.10"), b'"0.10"'),
        (bytes, b"\x00\x01", b'"AAE="'),
        (Literal["a", "b"], "b", b'"b"'),
        (Union[int, str], "x", b'"x"'),
        (UserId, UserId(5), b"5"),
        (Any, {"free": ["form"]}, b'{"free":["form"]}'),
        (Cart, Cart([Qty("a", 1)], extra={"w": 0.5}), None),
        (
            Node,
            Node("root", [Node("leaf")]),
            b'{"name":"root","children":[{"name":"leaf","children":[]}]}',
        ),
        (Person, {"name": "Ada", "address": {"zip": "1"}}, b'{"name":"Ada","address":{"zip":"1"}}'),
    ],
)
def test_json_both_ways(tp: Any, value: Any, wire: Optional[bytes]) -> None:
    codec = JsonCodec(tp)
    data = codec.encode(value)
    if wire is not None:
        assert data == wire
    back = codec.decode(data)
    assert back == value and type(back) is type(value)


def test_json_reads_what_other_producers_write() -> None:
    assert JsonCodec(datetime).decode(b'"2030-01-01T00:00:00Z"') == datetime(
        2030, 1, 1, tzinfo=timezone.utc
    )
    assert JsonCodec(float).decode(b"2") == 2.0
    assert JsonCodec(Decimal).decode(b"2.5") == Decimal("2.5")
    # Keys the type does not know are ignored: a newer producer may send more.
    assert JsonCodec(Qty).decode(b'{"sku":"a","qty":1,"added_later":true}') == Qty("a", 1)
    assert JsonCodec(Optional[int]).decode(b"") is None  # a job without a payload


@pytest.mark.parametrize(
    ("tp", "data", "message"),
    [
        (
            Cart,
            b'{"items":[{"sku":"a","qty":1},{"sku":"b","qty":"2"}]}',
            ".items[1].qty: expected int, got str",
        ),
        (Cart, b'{"items":[{"qty":1}]}', ".items[0].sku: missing"),
        (Cart, b'{"items":{}}', ".items: expected a list, got dict"),
        (Cart, b'{"items":[],"extra":{"w":"x"}}', ".extra['w']: expected float, got str"),
        (Cart, b"[]", "expected an object (Cart), got list"),
        (Node, b'{"name":"r","children":[{"name":1}]}', ".children[0].name: expected str, got int"),
        (Person, b'{"name":"A","address":{"zip":2}}', ".address.zip: expected str, got int"),
        (Person, b'{"address":{}}', ".name: missing"),
        (int, b"true", "expected int, got bool"),
        (int, b"1.0", "expected int, got float"),
        (bool, b"1", "expected bool, got int"),
        (Color, b'"green"', "expected one of ['red', 'blue'], got 'green'"),
        (Level, b'"1"', "expected one of [1, 2], got '1'"),
        (uuid.UUID, b'"nope"', "not a valid UUID: 'nope'"),
        (date, b"20300101", "expected date as a string, got int"),
        (Decimal, b'"x"', "not a valid Decimal: 'x'"),
        (tuple[int, str], b"[1]", "expected a list of 2 items, got a list of 1"),
        (tuple[int, str], b"{}", "expected a list of 2 items, got dict"),
        (tuple[int, str], b"[1,2]", "[1]: expected str, got int"),
        (dict[int, str], b'{"a":"b"}', "key 'a': not an integer"),
        (
            dict[Color, int],
            b'{"green":1}',
            "key 'green': expected one of ['red', 'blue'], got 'green'",
        ),
        (dict[str, int], b"[]", "expected an object, got list"),
        (list[int], b"{}", "expected a list, got dict"),
        (tuple[int, ...], b"{}", "expected a list, got dict"),
        (set[int], b"{}", "expected a list (for a set), got dict"),
        (set[Any], b"[1,[2]]", "[1]: expected a hashable value, got list"),
        (frozenset, b'[{"a":1}]', "[0]: expected a hashable value, got dict"),
        (
            datetime,
            b'"soon"',
            "expected a datetime as datetime.isoformat() writes it (Z for UTC too), got 'soon'",
        ),
        (
            date,
            b'"2030-13-01"',
            "expected a date as date.isoformat() writes it (YYYY-MM-DD), got '2030-13-01'",
        ),
        (bytes, b'"!!"', "not valid base64: '!!'"),
        (bytes, b"1", "expected bytes as a base64 string, got int"),
        (float, b'"1"', "expected float, got str"),
        (type(None), b"1", "expected null, got int"),
        (Decimal, b"true", "expected Decimal, got bool"),
        (Literal["a"], b'"b"', "expected one of ['a'], got 'b'"),
        (Union[int, str], b"[]", "expected int | str, got list"),
        (Union[Qty, int], b'{"sku":"a"}', ".qty: missing"),
        (Optional[int], b'"1"', "expected int, got str"),
        (Positive, b'{"n":0}', "Positive: n must be positive"),
        (int, b"NaN", "not valid JSON: NaN is not JSON"),
        (
            int,
            b"{",
            "not valid JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
        (
            int,
            b"\xff",
            "not valid JSON: 'utf-8' codec can't decode byte 0xff in position 0: "
            "invalid start byte",
        ),
    ],
)
def test_what_does_not_fit_is_named(tp: Any, data: bytes, message: str) -> None:
    assert load_error(tp, data) == message


def test_encoding_checks_the_value_too() -> None:
    with pytest.raises(InputError, match=r"^\.items\[0\]\.qty: expected int, got str$"):
        JsonCodec(Cart).encode(Cart([Qty("a", "1")]))  # type: ignore[arg-type]
    with pytest.raises(InputError, match="Out of range float values are not JSON compliant"):
        JsonCodec(float).encode(float("nan"))
    with pytest.raises(InputError, match="expected date, got datetime"):
        JsonCodec(date).encode(datetime(2030, 1, 1))
    with pytest.raises(InputError, match="expected bytes"):
        BytesCodec().encode("text")
    with pytest.raises(InputError, match="expected str"):
        TextCodec().encode(b"bytes")
    with pytest.raises(InputError, match="not UTF-8 text"):
        TextCodec().decode(b"\xff")


def test_what_does_not_fit_is_named_when_encoding_too() -> None:
    cases: list[tuple[Any, Any, str]] = [
        (dict[str, int], {1: 1}, "key 1: expected str, got int"),
        (dict[int, str], {"a": "b"}, "key 'a': expected int, got str"),
        (dict[str, int], {"a": "b"}, "['a']: expected int, got str"),
        (dict[str, int], [("a", 1)], "expected an object, got list"),
        (Color, "red", "expected Color, got str"),
        (Decimal, 1.5, "expected Decimal, got float"),
        (tuple[int, str], (1,), "expected a list of 2 items, got a tuple of 1"),
        (list[int], "ab", "expected a list, got str"),
        (tuple[int, ...], "ab", "expected a tuple, got str"),
        (set[int], "ab", "expected a set, got str"),
        (frozenset[int], "ab", "expected a frozenset, got str"),
        (Qty, {"sku": "a", "qty": 1}, "expected Qty, got dict"),
        (Person, [], "expected an object (Person), got list"),
        (Literal["a"], "b", "expected one of ['a'], got 'b'"),
        (Union[int, str], 1.5, "expected int | str, got float"),
        (uuid.UUID, "x", "expected UUID, got str"),
        (bytes, "x", "expected bytes, got str"),
        (float, "1", "expected float, got str"),
        # Under Any (and in a bare container) a value travels as it is: JSON data only.
        (
            list[Any],
            [date(2030, 1, 1)],
            "Object of type date is not JSON serializable (a value typed Any, or in a "
            "bare dict, list, tuple or set, must be JSON data: dict, list, str, int, "
            "float, bool or None)",
        ),
        (dict, {"a": {1, 2}}, "Object of type set is not JSON serializable"),
    ]
    for tp, value, message in cases:
        with pytest.raises(InputError) as caught:
            JsonCodec(tp).encode(value)
        assert str(caught.value).startswith(message), (tp, str(caught.value))


@dataclass
class Box(Generic[T]):
    item: T


def test_types_that_cannot_be_json_are_refused_at_registration() -> None:
    @dataclass
    class Local:
        inner: LocalInner  # type: ignore[name-defined]  # noqa: F821 - defined nowhere

    carried = "cannot be carried as JSON by sepp_lite.tasks (give the task a codec= for it)"
    cases: list[tuple[Any, str]] = [
        (complex, f"complex {carried}"),
        (set[complex], f"complex {carried}"),
        (type, f"type {carried}"),
        (
            dict[float, int],
            "dict keys of type float cannot be carried as JSON object keys by "
            "sepp_lite.tasks (keys may be str, int, a str-valued Enum, UUID, date or datetime)",
        ),
        (dict[Level, int], "dict keys of type Level cannot be carried"),
        (type[int], f"type[int] {carried}"),
        (Box[int], f"{__name__}.Box[int]: generic dataclasses are not supported"),
        (
            Local,
            "cannot resolve the annotations of test_types_that_cannot_be_json_are_refused_at_"
            "registration.<locals>.Local (name 'LocalInner' is not defined): the names they "
            "use must be defined at the top level of its module, tests.test_typed_tasks_convert",
        ),
        ("Qty", "'Qty' is the name of a type, not a type: pass the type itself"),
        (list["Qty"], "'Qty' is the name of a type, not a type: pass the type itself"),
    ]
    for tp, message in cases:
        with pytest.raises(TypeError) as caught:
            JsonCodec(tp)
        assert str(caught.value).startswith(message), (tp, str(caught.value))
    # input_type= cannot help a class whose own annotations do not resolve.
    with pytest.raises(TypeError, match="cannot resolve the annotations of"):
        Tasks(queue="q").task(input_type=Local)(take_any)


async def take_any(value: Any) -> None: ...


# -- bare containers ---------------------------------------------------------------------


BARE: list[tuple[Any, Any, Any, bytes]] = [
    (dict, dict[str, Any], {"a": [1, {"b": None}]}, b'{"a":[1,{"b":null}]}'),
    (typing.Dict, dict[str, Any], {"a": 1}, b'{"a":1}'),  # noqa: UP006 - the alias itself
    (abc.Mapping, dict[str, Any], {"a": 1}, b'{"a":1}'),
    (abc.MutableMapping, dict[str, Any], {"a": 1}, b'{"a":1}'),
    (list, list[Any], [1, "x", None, [2]], b'[1,"x",null,[2]]'),
    (typing.List, list[Any], [1], b"[1]"),  # noqa: UP006 - the alias itself
    (abc.Sequence, list[Any], [1], b"[1]"),
    (abc.MutableSequence, list[Any], [1], b"[1]"),
    (abc.Iterable, list[Any], [1], b"[1]"),
    (tuple, tuple[Any, ...], (1, "x"), b'[1,"x"]'),
    (typing.Tuple, tuple[Any, ...], (1, "x", 2), b'[1,"x",2]'),  # noqa: UP006 - the alias itself
    (set, set[Any], {1}, b"[1]"),
    (typing.Set, set[Any], {"a"}, b'["a"]'),  # noqa: UP006 - the alias itself
    (abc.Set, set[Any], {1}, b"[1]"),
    (abc.MutableSet, set[Any], {1}, b"[1]"),
    (frozenset, frozenset[Any], frozenset({"a"}), b'["a"]'),
    (typing.FrozenSet, frozenset[Any], frozenset({1}), b"[1]"),  # noqa: UP006 - the alias itself
]


@pytest.mark.parametrize(("bare", "parameterised", "value", "wire"), BARE, ids=str)
def test_bare_containers_are_json_like_their_any_forms(
    bare: Any, parameterised: Any, value: Any, wire: bytes
) -> None:
    for tp in (bare, parameterised):
        codec = codec_for(tp)
        assert isinstance(codec, JsonCodec), tp
        assert codec.encode(value) == wire
        back = codec.decode(wire)
        assert back == value and type(back) is type(value), (tp, back)


def test_a_task_takes_a_bare_container() -> None:
    tasks = Tasks(queue="q")

    @tasks.task
    async def record(event: dict) -> None: ...  # type: ignore[type-arg]

    assert record.input_type is dict
    assert record.payload({"a": [1]}).data == b'{"a":[1]}'  # type: ignore[union-attr]
    assert record.decode(b'{"a":[1]}') == {"a": [1]}
    with pytest.raises(InputError, match="^record: event: expected an object, got list$"):
        record.decode(b"[]")


def test_the_codec_follows_the_annotation() -> None:
    assert isinstance(codec_for(bytes), BytesCodec)
    assert isinstance(codec_for(str), TextCodec)
    assert isinstance(codec_for(Optional[str]), JsonCodec)
    assert isinstance(codec_for(Cart), JsonCodec)


if NotRequired is not None:

    def test_typeddict_not_required_keys() -> None:
        class Partial(TypedDict):
            a: int
            b: NotRequired[int]  # type: ignore[valid-type]

        assert JsonCodec(Partial).decode(b'{"a":1}') == {"a": 1}


# -- pydantic and msgspec: used when the program has them -----------------------------------


try:
    import pydantic
except ImportError:
    pydantic = None
try:
    import msgspec
except ImportError:
    msgspec = None

if pydantic is not None:

    class PLine(pydantic.BaseModel):
        sku: str
        qty: int

    class PBill(pydantic.BaseModel):
        lines: list[PLine]

    @dataclass
    class Holder:
        bill: PBill


if msgspec is not None:

    class MLine(msgspec.Struct):
        sku: str
        qty: int

    class MBill(msgspec.Struct):
        lines: list[MLine]

    @dataclass
    class MHolder:
        bill: MBill

    class MBag(msgspec.Struct):
        d: dict  # type: ignore[type-arg]
        l: list  # type: ignore[type-arg]  # noqa: E741
        t: tuple  # type: ignore[type-arg]
        s: set  # type: ignore[type-arg]
        f: frozenset  # type: ignore[type-arg]


if pydantic is not None:

    class PBag(pydantic.BaseModel):
        d: dict  # type: ignore[type-arg]
        l: list  # type: ignore[type-arg]  # noqa: E741
        t: tuple  # type: ignore[type-arg]
        s: set  # type: ignore[type-arg]
        f: frozenset  # type: ignore[type-arg]


@dataclass
class Bag:
    d: dict  # type: ignore[type-arg]
    l: list  # type: ignore[type-arg]  # noqa: E741
    t: tuple  # type: ignore[type-arg]
    s: set  # type: ignore[type-arg]
    f: frozenset  # type: ignore[type-arg]


@pytest.mark.skipif(pydantic is None, reason="pydantic is optional (not installed)")
def test_pydantic_models_are_validated_by_pydantic() -> None:
    tasks = Tasks(queue="q")

    @tasks.task
    async def bill(b: PBill) -> None: ...

    codec = bill.codec
    assert type(codec).__name__ == "PydanticCodec" and codec.encoding == "application/json"
    value = PBill(lines=[PLine(sku="a", qty=1)])
    assert codec.encode(value) == b'{"lines":[{"sku":"a","qty":1}]}'
    assert codec.decode(codec.encode(value)) == value
    with pytest.raises(InputError) as caught:
        codec.decode(b'{"lines":[{"sku":"a","qty":1},{"sku":"b","qty":"many"}]}')
    assert caught.value.path == ".lines[1].qty"
    assert "valid integer" in caught.value.problem
    # Every problem pydantic found is in the one error, the first one located.
    with pytest.raises(InputError) as caught:
        codec.decode(b'{"lines":[{"sku":1,"qty":"x"},{"qty":2}]}')
    assert str(caught.value) == (
        ".lines[0].sku: Input should be a valid string (also .lines[0].qty: Input should "
        "be a valid integer, unable to parse string as an integer; .lines[1].sku: Field "
        "required)"
    )
    # A model inside a dataclass goes through pydantic as well.
    assert JsonCodec(Holder).decode(b'{"bill":{"lines":[]}}') == Holder(PBill(lines=[]))
    with pytest.raises(InputError, match=r"^\.bill\.lines: "):
        JsonCodec(Holder).decode(b'{"bill":{"lines":1}}')
    with pytest.raises(InputError, match=r"^\.bill: expected PBill, got dict$"):
        JsonCodec(Holder).encode(Holder({"lines": []}))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^expected PBill, got dict$"):
        codec.encode({"lines": []})


@pytest.mark.skipif(msgspec is None, reason="msgspec is optional (not installed)")
def test_msgspec_structs_are_validated_by_msgspec() -> None:
    codec = codec_for(MBill)
    assert type(codec).__name__ == "MsgspecCodec" and codec.encoding == "application/json"
    value = MBill(lines=[MLine("a", 1)])
    assert codec.encode(value) == b'{"lines":[{"sku":"a","qty":1}]}'
    assert codec.decode(codec.encode(value)) == value
    with pytest.raises(InputError) as caught:
        codec.decode(b'{"lines":[{"sku":"a","qty":"x"}]}')
    assert str(caught.value) == ".lines[0].qty: Expected `int`, got `str`"
    with pytest.raises(InputError, match="^Expected `object`, got `array`$"):
        codec.decode(b"[]")
    with pytest.raises(InputError, match="not valid JSON"):
        codec.decode(b"{")
    with pytest.raises(InputError, match=r"^expected MBill, got dict$"):
        codec.encode({"lines": []})
    # A Struct inside a dataclass goes through msgspec as well, both ways.
    assert JsonCodec(MHolder).decode(b'{"bill":{"lines":[]}}') == MHolder(MBill(lines=[]))
    with pytest.raises(InputError, match=r"^\.bill\.lines: Expected `array`, got `int`$"):
        JsonCodec(MHolder).decode(b'{"bill":{"lines":1}}')
    with pytest.raises(InputError, match=r"^\.bill: expected MBill, got dict$"):
        JsonCodec(MHolder).encode(MHolder({"lines": []}))  # type: ignore[arg-type]


@pytest.mark.skipif(pydantic is None or msgspec is None, reason="pydantic and msgspec are optional")
def test_bare_containers_travel_alike_in_a_dataclass_a_pydantic_model_and_a_struct() -> None:
    fields = {"d": {"a": [1]}, "l": [1, "x"], "t": (1, "y"), "s": {3, 1}, "f": frozenset({2})}
    wire = b'{"d":{"a":[1]},"l":[1,"x"],"t":[1,"y"],"s":[1,3],"f":[2]}'
    unhashable = b'{"d":{},"l":[],"t":[],"s":[1,[2]],"f":[]}'
    for tp in (Bag, PBag, MBag):
        codec = codec_for(tp)
        assert codec.encode(tp(**fields)) == wire, tp
        back = codec.decode(wire)
        assert {name: getattr(back, name) for name in fields} == fields, tp
        assert [type(getattr(back, name)) for name in fields] == [dict, list, tuple, set, frozenset]
        with pytest.raises(InputError) as caught:
            codec.decode(unhashable)
        # msgspec before 0.21 (the last for Python 3.9 is 0.20) raises a bare TypeError
        # for the unhashable element, with no path to give.
        old_msgspec = tp is MBag and tuple(map(int, msgspec.__version__.split(".")[:2])) < (0, 21)
        assert caught.value.path == ("" if old_msgspec else ".s[1]"), (tp, str(caught.value))
