"""Compile a .proto file to a FileDescriptorSet for the tests: with grpcio-tools where
it is installed (CPython), else with a ``protoc`` binary (Debian: protobuf-compiler and
libprotobuf-dev, which CI installs for PyPy)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
QUEUE_PROTO = "sepp/v1/queue.proto"


def _command(include: Path, out: Path, proto: str) -> list[str]:
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        protoc = shutil.which("protoc")
        if protoc is None:
            raise RuntimeError(
                "the contract tests need grpcio-tools or a protoc binary "
                "(apt-get install protobuf-compiler libprotobuf-dev)"
            ) from None
        head = [protoc, "-I/usr/include"]
    else:
        head = [sys.executable, "-m", "grpc_tools.protoc"]
    return [*head, f"-I{include}", f"--descriptor_set_out={out}", proto]


def compile_file(
    include: Path = PROTO_DIR, proto: str = QUEUE_PROTO
) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of ``proto`` (relative to ``include``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        subprocess.run(_command(include, out, proto), check=True, capture_output=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]
