"""The codecs that turn a task's input into a payload and back, chosen once per task
from the input's annotation: ``bytes`` as they are, ``str`` as UTF-8 text, a pydantic
model or a msgspec Struct through its own library, anything else as JSON through
:mod:`sepp_lite.tasks._convert` (the standard library only)."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Optional, Protocol, runtime_checkable

from sepp_lite.tasks._convert import (
    InputError,
    converter,
    msgspec_error,
    msgspec_struct,
    pydantic_error,
    pydantic_model,
    type_name,
)

__all__ = [
    "BytesCodec",
    "Codec",
    "CodecFactory",
    "JsonCodec",
    "TextCodec",
    "codec_for",
]

JSON = "application/json"


@runtime_checkable
class Codec(Protocol):
    """How a task's input becomes a payload and back: ``encode(value) -> bytes``,
    ``decode(data) -> value`` and the payload's ``encoding`` string. ``decode`` raises
    ``ValueError`` (or :class:`~sepp_lite.tasks.InputError`, which says where) for
    data that does not fit: the job is then dead-lettered, never retried."""

    encoding: str

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


CodecFactory = Callable[[Any], Optional[Codec]]
"""A registry-wide codec: called with each task's input type, it returns the codec
for it, or None to leave that type to the built-in choice."""


class BytesCodec:
    """``bytes`` as they are (``application/octet-stream``)."""

    encoding = "application/octet-stream"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InputError(f"expected bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return data


class TextCodec:
    """``str`` as UTF-8 (``text/plain``)."""

    encoding = "text/plain"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise InputError(f"expected str, got {type(value).__name__}")
        return value.encode("utf-8")

    def decode(self, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text: {exc}") from None


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Compact, UTF-8, and no NaN or Infinity: what every other language's JSON reads.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder(parse_constant=_no_constants)
_ANY_IS_JSON = (
    "(a value typed Any, or in a bare dict, list, tuple or set, must be JSON data: "
    "dict, list, str, int, float, bool or None)"
)


class JsonCodec:
    """A type carried as JSON (``application/json``), checked both ways: a dataclass is
    a plain JSON object, so a producer in any language can send one."""

    encoding = JSON

    def __init__(self, tp: Any) -> None:
        self.type = tp
        self._dump, self._load = converter(tp)

    def encode(self, value: Any) -> bytes:
        data = self._dump(value)
        try:
            return _ENCODER.encode(data).encode("utf-8")
        except ValueError as exc:  # NaN or infinity
            raise InputError(str(exc)) from None
        except TypeError as exc:  # under Any, the converter passes values as they are
            raise InputError(f"{exc} {_ANY_IS_JSON}") from None

    def decode(self, data: bytes) -> Any:
        try:
            obj = _DECODER.decode(data.decode("utf-8")) if data else None
        except ValueError as exc:
            raise InputError(f"not valid JSON: {exc}") from None
        return self._load(obj)

    def __repr__(self) -> str:
        return f"JsonCodec({type_name(self.type)})"


class PydanticCodec:
    """A pydantic v2 model, validated by pydantic (``application/json``)."""

    encoding = JSON

    def __init__(self, tp: Any) -> None:
        self.type = tp
        self._invalid = sys.modules["pydantic"].ValidationError

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, self.type):
            raise InputError(f"expected {self.type.__name__}, got {type(value).__name__}")
        data: bytes = value.model_dump_json().encode("utf-8")
        return data

    def decode(self, data: bytes) -> Any:
        try:
            return self.type.model_validate_json(data or b"null")
        except self._invalid as exc:
            raise pydantic_error(exc) from None


class MsgspecCodec:
    """A ``msgspec.Struct``, validated by msgspec (``application/json``)."""

    encoding = JSON

    def __init__(self, tp: Any) -> None:
        msgspec = sys.modules["msgspec"]
        self.type = tp
        self._invalid = msgspec.ValidationError
        self._decode_error = msgspec.DecodeError
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(tp)

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, self.type):
            raise InputError(f"expected {self.type.__name__}, got {type(value).__name__}")
        data: bytes = self._encoder.encode(value)
        return data

    def decode(self, data: bytes) -> Any:
        try:
            return self._decoder.decode(data or b"null")
        except self._invalid as exc:
            raise msgspec_error(exc) from None
        except self._decode_error as exc:
            raise InputError(f"not valid JSON: {exc}") from None
        except TypeError as exc:  # msgspec before 0.21: a list where a set's element goes
            raise InputError(str(exc)) from None


def codec_for(tp: Any, factory: Optional[CodecFactory] = None) -> Codec:
    """The codec of input type ``tp``: the registry's ``factory`` first, then the
    built-in choice; ``TypeError`` for a type none of them can carry."""
    if factory is not None:
        chosen = factory(tp)
        if chosen is not None:
            return chosen
    if tp is bytes:
        return BytesCodec()
    if tp is str:
        return TextCodec()
    if pydantic_model(tp):
        return PydanticCodec(tp)
    if msgspec_struct(tp):
        return MsgspecCodec(tp)
    return JsonCodec(tp)
