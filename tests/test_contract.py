"""proto/sepp/v1/queue.proto against the wire contract: package, service, every message,
field name, number, type, label and oneof. A renamed or renumbered field fails here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tests import contract_table
from tests.client_helpers import NO_SEPP_PY
from tests.proto_compile import PROTO_DIR, QUEUE_PROTO, compile_file

FDP = descriptor_pb2.FieldDescriptorProto
Row = tuple[int, str, str, str, str]


def _type_name(field: FDP) -> str:
    if field.type in (FDP.TYPE_MESSAGE, FDP.TYPE_ENUM):
        return field.type_name.lstrip(".")
    return FDP.Type.Name(field.type)[len("TYPE_") :].lower()


def _rows(message: descriptor_pb2.DescriptorProto) -> list[Row]:
    entries = {f".{nested.name}": nested for nested in message.nested_type}
    rows = []
    for field in message.field:
        entry = next(
            (e for n, e in entries.items() if field.type_name.endswith(f"{message.name}{n}")),
            None,
        )
        if entry is not None and entry.options.map_entry:
            key, value = entry.field
            kind = f"map<{_type_name(key)}, {_type_name(value)}>"
            rows.append((field.number, field.name, kind, "map", ""))
            continue
        if field.label == FDP.LABEL_REPEATED:
            label = "repeated"
        elif field.proto3_optional:
            label = "optional"
        else:
            label = ""
        real_oneof = field.HasField("oneof_index") and not field.proto3_optional
        oneof = message.oneof_decl[field.oneof_index].name if real_oneof else ""
        rows.append((field.number, field.name, _type_name(field), label, oneof))
    return rows


def contract_differences(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """Every way ``file`` differs from the contract table (empty when it matches)."""
    problems = []
    if file.package != contract_table.PACKAGE or file.syntax != "proto3":
        problems.append(f"package/syntax: {file.package} {file.syntax}")
    expected_imports = {
        "google/protobuf/duration.proto",
        "google/protobuf/empty.proto",
        "google/protobuf/timestamp.proto",
    }
    if set(file.dependency) != expected_imports:
        problems.append(f"imports: {sorted(file.dependency)}")
    ours = {m.name: sorted(_rows(m)) for m in file.message_type}
    theirs = {name: sorted(rows) for name, rows in contract_table.MESSAGES.items()}
    for name in sorted(set(ours) | set(theirs)):
        if ours.get(name) != theirs.get(name):
            problems.append(f"message {name}: {ours.get(name)} != {theirs.get(name)}")
    enums = {e.name: {v.name: v.number for v in e.value} for e in file.enum_type}
    if enums != contract_table.ENUMS:
        problems.append(f"enums: {enums}")
    problems += _service_differences(file)
    return problems


def _service_differences(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    if [s.name for s in file.service] != [contract_table.SERVICE]:
        return [f"services: {[s.name for s in file.service]}"]
    methods = {
        m.name: (m.input_type.lstrip("."), m.output_type.lstrip("."))
        for m in file.service[0].method
        if not (m.client_streaming or m.server_streaming)
    }
    return [] if methods == contract_table.RPCS else [f"rpcs: {methods}"]


@pytest.fixture(scope="module")
def compiled() -> descriptor_pb2.FileDescriptorProto:
    return compile_file()


def test_proto_matches_the_wire_contract(compiled: descriptor_pb2.FileDescriptorProto) -> None:
    assert contract_differences(compiled) == []


def test_contract_table_is_complete() -> None:
    # 42 messages and every rejection variant, including the two sepp-py's proto added.
    assert len(contract_table.MESSAGES) == 42
    rejection = {row[1]: row[0] for row in contract_table.MESSAGES["JobRejection"]}
    assert rejection["queue_full"] == 13 and rejection["queue_closing"] == 14
    assert len(rejection) == 14


@pytest.mark.parametrize(
    ("old", "new", "what"),
    [
        ("uint32 attempt = 7;", "uint32 attempts = 7;", "renamed field"),
        ("uint32 attempt = 7;", "uint32 attempt = 13;", "renumbered field"),
        ("optional uint32 priority = 5;", "uint32 priority = 5;", "lost presence"),
        (
            "  uint64 limit = 2;\n}\n\nmessage QueueClosing",
            "  uint32 limit = 2;\n}\n\nmessage QueueClosing",
            "type",
        ),
        ("    QueueClosing queue_closing = 14;\n", "", "dropped oneof member"),
    ],
)
def test_a_changed_contract_is_caught(tmp_path: Path, old: str, new: str, what: str) -> None:
    text = (PROTO_DIR / QUEUE_PROTO).read_text()
    assert old in text, what
    target = tmp_path / QUEUE_PROTO
    target.parent.mkdir(parents=True)
    target.write_text(text.replace(old, new, 1))
    assert contract_differences(compile_file(tmp_path)) != [], what


def test_matches_the_official_clients_descriptor(
    compiled: descriptor_pb2.FileDescriptorProto,
) -> None:
    """sepp-py 0.1.0 ships the newest wire contract; ours must be the same descriptor
    (source comments, options and json names aside). sepp-py installs on CPython 3.10+."""
    queue_pb2 = pytest.importorskip("sepp.v1.queue_pb2", reason=NO_SEPP_PY)
    official = descriptor_pb2.FileDescriptorProto()
    queue_pb2.DESCRIPTOR.CopyToProto(official)
    ours = descriptor_pb2.FileDescriptorProto()
    ours.CopyFrom(compiled)
    for file in (ours, official):
        file.ClearField("source_code_info")
        file.ClearField("options")
        for message in file.message_type:
            for field in message.field:
                field.ClearField("json_name")
            for nested in message.nested_type:
                for field in nested.field:
                    field.ClearField("json_name")
    assert ours == official


def test_generated_code_is_committed_and_current() -> None:
    """`make proto` output lives in sepp_lite/_proto (CI also regenerates and diffs)."""
    generated = PROTO_DIR.parent / "sepp_lite" / "_proto" / "sepp" / "v1" / "__init__.py"
    text = generated.read_text()
    assert "DO NOT EDIT" in text and "sources: sepp/v1/queue.proto" in text
    assert "class QueueServiceBase" in text and "class QueueServiceStub" in text
    assert shutil.which("git") is not None
