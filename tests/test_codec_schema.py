"""sepp_lite._codec.schema against the descriptor compiled from proto/sepp/v1/queue.proto:
every field's tag (number and wire type), the oneof tables both ways, the DeadLetterCause
numbering, and the shared layouts the codec's readers rely on. A renumbered field, a
changed type or a new oneof member fails here before any bytes do."""

from __future__ import annotations

import dataclasses
import re

import pytest
from google.protobuf import descriptor_pb2, duration_pb2, timestamp_pb2

from sepp_lite import errors
from sepp_lite._codec import schema
from sepp_lite._codec._fields import key, uvarint
from sepp_lite._codec.dead_letters import DeadLetterMessage, DrainIn
from sepp_lite._codec.job import JobMessage
from sepp_lite._codec.job_rejection import MEMBER_FIELDS
from sepp_lite._codec.lease import ExtendResult, NackResult
from tests.proto_compile import compile_file

FDP = descriptor_pb2.FieldDescriptorProto
_FIXED64 = {FDP.TYPE_DOUBLE, FDP.TYPE_FIXED64, FDP.TYPE_SFIXED64}
_FIXED32 = {FDP.TYPE_FLOAT, FDP.TYPE_FIXED32, FDP.TYPE_SFIXED32}
_DELIMITED = {FDP.TYPE_STRING, FDP.TYPE_BYTES, FDP.TYPE_MESSAGE}
_WIRE_TYPE_NAMES = {"VARINT", "I64", "LEN", "I32"}
# The two oneofs the codec reads and writes member by member, without a table.
_ONEOFS_WITHOUT_TABLES = {"PRIMITIVE_VALUE_VALUE", "JOB_RESULT_OUTCOME"}


def _wire_type(field: descriptor_pb2.FieldDescriptorProto) -> int:
    if field.label == FDP.LABEL_REPEATED and field.type not in _DELIMITED:
        return schema.LEN  # proto3 packs repeated scalars
    if field.type in _FIXED64:
        return schema.I64
    if field.type in _FIXED32:
        return schema.I32
    if field.type in _DELIMITED:
        return schema.LEN
    return schema.VARINT


def _upper_snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()


def _tag(field: descriptor_pb2.FieldDescriptorProto) -> int:
    return field.number << 3 | _wire_type(field)


def _well_known() -> list[descriptor_pb2.DescriptorProto]:
    out = []
    for module, name in ((timestamp_pb2, "Timestamp"), (duration_pb2, "Duration")):
        proto = descriptor_pb2.DescriptorProto()
        module.DESCRIPTOR.message_types_by_name[name].CopyToProto(proto)
        out.append(proto)
    return out


@pytest.fixture(scope="module")
def compiled() -> descriptor_pb2.FileDescriptorProto:
    return compile_file()


@pytest.fixture(scope="module")
def messages(compiled: descriptor_pb2.FileDescriptorProto) -> list[descriptor_pb2.DescriptorProto]:
    return [*compiled.message_type, *_well_known()]


def _expected_tags(messages: list[descriptor_pb2.DescriptorProto]) -> dict[str, int]:
    expected: dict[str, int] = {}
    for message in messages:
        for field in message.field:
            name = f"{_upper_snake(message.name)}_{field.name.upper()}"
            assert name not in expected, f"the naming rule gives {name} twice"
            expected[name] = _tag(field)
    return expected


def _schema_ints() -> dict[str, int]:
    return {
        name: value
        for name, value in vars(schema).items()
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool)
    }


def test_every_field_has_its_tag(messages: list[descriptor_pb2.DescriptorProto]) -> None:
    expected = _expected_tags(messages)
    ours = _schema_ints()
    missing = sorted(set(expected) - set(ours))
    wrong = {
        name: (ours[name], tag) for name, tag in expected.items() if ours.get(name, tag) != tag
    }
    assert missing == []
    assert wrong == {}


def test_the_schema_has_no_other_constants(messages: list[descriptor_pb2.DescriptorProto]) -> None:
    others = set(_schema_ints()) - set(_expected_tags(messages)) - _WIRE_TYPE_NAMES
    assert others == {"MAP_ENTRY_KEY", "MAP_ENTRY_VALUE"}
    assert (schema.VARINT, schema.I64, schema.LEN, schema.I32) == (0, 1, 2, 5)


def test_map_entries(compiled: descriptor_pb2.FileDescriptorProto) -> None:
    entries = [
        nested
        for message in compiled.message_type
        for nested in message.nested_type
        if nested.options.map_entry
    ]
    assert len(entries) == 2  # Job.custom and EnqueueRequest.custom
    for entry in entries:
        key_field, value_field = sorted(entry.field, key=lambda f: f.number)
        assert (_tag(key_field), _tag(value_field)) == (
            schema.MAP_ENTRY_KEY,
            schema.MAP_ENTRY_VALUE,
        )


def test_shared_layouts_hold(compiled: descriptor_pb2.FileDescriptorProto) -> None:
    # One reader serves Payload, TraceContext and map entries; one serves Timestamp and
    # Duration.
    assert schema.PAYLOAD_DATA == schema.TRACE_CONTEXT_TRACEPARENT == schema.MAP_ENTRY_KEY
    assert schema.PAYLOAD_ENCODING == schema.TRACE_CONTEXT_TRACESTATE == schema.MAP_ENTRY_VALUE
    assert (schema.TIMESTAMP_SECONDS, schema.TIMESTAMP_NANOS) == (
        schema.DURATION_SECONDS,
        schema.DURATION_NANOS,
    )
    # The Job reader takes each tag for one byte.
    [job] = [m for m in compiled.message_type if m.name == "Job"]
    assert max(_tag(f) for f in job.field) < 0x80
    # Every tag has its encoding in the writers' table.
    assert all(key(tag) == uvarint(tag) for tag in _schema_ints().values())


def _oneofs(
    compiled: descriptor_pb2.FileDescriptorProto,
) -> dict[str, list[descriptor_pb2.FieldDescriptorProto]]:
    oneofs = {}
    for message in compiled.message_type:
        for index, decl in enumerate(message.oneof_decl):
            members = [
                f
                for f in message.field
                if f.HasField("oneof_index") and f.oneof_index == index and not f.proto3_optional
            ]
            if members:  # proto3 optional fields sit in synthetic one-member oneofs
                oneofs[f"{_upper_snake(message.name)}_{decl.name.upper()}"] = members
    return oneofs


def test_oneof_tables_cover_every_member_both_ways(
    compiled: descriptor_pb2.FileDescriptorProto,
) -> None:
    oneofs = _oneofs(compiled)
    with_tables = {name for name in oneofs if hasattr(schema, f"{name}_MEMBERS")}
    assert set(oneofs) - with_tables == _ONEOFS_WITHOUT_TABLES
    for name in with_tables:
        members = getattr(schema, f"{name}_MEMBERS")
        tags = getattr(schema, f"{name}_TAGS")
        assert set(members) == {_tag(f) for f in oneofs[name]}, name
        assert tags == {meaning: member for member, meaning in members.items()}, name


def test_oneof_members_mean_what_they_name(compiled: descriptor_pb2.FileDescriptorProto) -> None:
    oneofs = _oneofs(compiled)
    for name in ("NACK_RETRY_STRATEGY", "ENQUEUE_ATOMIC_RESPONSE_OUTCOME"):
        members = getattr(schema, f"{name}_MEMBERS")
        assert {members[_tag(f)] for f in oneofs[name]} == {f.name for f in oneofs[name]}
    # Each rejection member carries the message of the same name as the error class.
    for field in oneofs["JOB_REJECTION_REASON"]:
        name = schema.JOB_REJECTION_REASON_MEMBERS[_tag(field)]
        assert name == field.type_name.rsplit(".", 1)[-1]
        assert getattr(errors, name).__name__ == name


def test_rejection_members_line_up_with_their_dataclasses(
    compiled: descriptor_pb2.FileDescriptorProto,
) -> None:
    by_name = {m.name: m for m in compiled.message_type}
    names = set(schema.JOB_REJECTION_REASON_MEMBERS.values())
    assert {cls.__name__ for cls in MEMBER_FIELDS} == names
    for cls, spec in MEMBER_FIELDS.items():
        message = by_name[cls.__name__]
        assert [tag for tag, _ in spec] == [_tag(f) for f in message.field], cls.__name__
        assert len(dataclasses.fields(cls)) == len(spec), cls.__name__


def test_dead_letter_causes_by_number(compiled: descriptor_pb2.FileDescriptorProto) -> None:
    [enum] = [e for e in compiled.enum_type if e.name == "DeadLetterCause"]
    assert len(schema.DEAD_LETTER_CAUSES) == len(enum.value)
    for value in enum.value:
        assert schema.DEAD_LETTER_CAUSES[value.number].name == value.name.removeprefix(
            "DEAD_LETTER_CAUSE_"
        )


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (JobMessage, "Job"),
        (DeadLetterMessage, "DeadLetterRecord"),
        (NackResult, "NackResponse"),
        (ExtendResult, "ExtendResponse"),
        (DrainIn, "DrainDeadLettersRequest"),
    ],
)
def test_decoded_records_list_their_fields_in_number_order(
    compiled: descriptor_pb2.FileDescriptorProto, record: type, message: str
) -> None:
    # The Job reader relies on it: a field's index in the record is its number less one.
    [proto] = [m for m in compiled.message_type if m.name == message]
    fields = sorted(proto.field, key=lambda f: f.number)
    assert [f.number for f in fields] == list(range(1, len(fields) + 1))
    assert record._fields == tuple(f.name for f in fields)
