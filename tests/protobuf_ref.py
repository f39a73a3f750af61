"""The official Google ``protobuf`` runtime as a second reference for the wire format.

betterproto 2.0.0b7 cannot tell an unset Timestamp/Duration from a zero one (it drops
zeros on encode and reads unset as the epoch / ``timedelta(0)``). The Google runtime keeps
presence exactly, so the tests use it wherever presence of such a field matters.

The message classes come from ``proto/sepp/v1/queue.proto`` (compiled by
:mod:`tests.proto_compile`) in a private descriptor pool, built once per session.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    message_factory,
    timestamp_pb2,
)

from tests.proto_compile import compile_file


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    # A private pool, so nothing here touches protobuf's default one. The well-known types
    # queue.proto imports are copied in from the runtime's own descriptors.
    pool = descriptor_pool.DescriptorPool()
    for module in (duration_pb2, empty_pb2, timestamp_pb2):
        file_proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(file_proto)
        pool.Add(file_proto)
    pool.Add(compile_file())
    return pool


@functools.cache
def message_class(name: str) -> Any:
    """The generated class of ``sepp.v1.<name>`` (or of a full name with a dot in it)."""
    full_name = name if "." in name else f"sepp.v1.{name}"
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def parse(name: str, data: bytes) -> Any:
    """Parse ``data`` as ``sepp.v1.<name>`` with the Google runtime (raises on bad bytes)."""
    msg = message_class(name)()
    msg.ParseFromString(data)
    return msg


def new(name: str, **fields: Any) -> Any:
    """A new ``sepp.v1.<name>`` message."""
    return message_class(name)(**fields)


def seconds_nanos(msg: Any) -> tuple[int, int]:
    """A Timestamp or Duration message as ``(seconds, nanos)``."""
    return int(msg.seconds), int(msg.nanos)
