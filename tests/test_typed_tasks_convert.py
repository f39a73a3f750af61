"""The codecs of sepp_lite.tasks on their own: each annotation's JSON both ways, the
error of a value that does not fit (naming the field's path), and the pydantic and
msgspec codecs (skipped without those libraries, which are not dependencies)."""

from __future__ import annotations

import enum
import sys
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Literal, NewType, Optional, TypedDict, Union

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
        (tuple[int, str], b"[1]", "expected a list of 2 items, got list"),
        (tuple[int, str], b"[1,2]", "[1]: expected str, got int"),
        (dict[int, str], b'{"a":"b"}', "['a']: expected an integer key, got 'a'"),
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


def test_types_that_cannot_be_json_are_refused_at_registration() -> None:
    for tp in (set[complex], complex, dict[float, int], type):
        with pytest.raises(TypeError):
            JsonCodec(tp)


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
    with pytest.raises(InputError, match="not valid JSON"):
        codec.decode(b"{")
