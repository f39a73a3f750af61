"""Shared helpers for the in-process server tests: request builders for driving the
state machine directly, and raw-bytes gRPC calls for driving it over sockets."""

from __future__ import annotations

from typing import Any, Optional

from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.encoding.base import CodecBase

from sepp_lite._codec.enqueue import EnqueueIn
from sepp_lite._codec.job import ReserveIn
from sepp_lite._codec.lease import LeaseIn
from sepp_lite.testing import ManualClock, QueueState, SeppTestServer, ServerConfig

START_MS = 1_700_000_000_000  # a fixed ManualClock start, so expected times are literal
UUID0 = "00000000-0000-4000-8000-000000000000"


def sn(seconds: float) -> tuple[int, int]:
    """A Duration/Timestamp as ``(seconds, nanos)`` from float seconds (ms precision)."""
    ms = round(seconds * 1000)
    whole, rest = divmod(ms, 1000)
    return whole, rest * 1_000_000


def ms_sn(ms: int) -> tuple[int, int]:
    whole, rest = divmod(ms, 1000)
    return whole, rest * 1_000_000


def job(queue: str = "q", job_type: str = "t", **fields: Any) -> EnqueueIn:
    """An ``EnqueueIn`` as the codec would decode it; ``fields`` set its attributes."""
    req = EnqueueIn()
    req.queue = queue
    req.job_type = job_type
    for name, value in fields.items():
        setattr(req, name, value)
    return req


def reserve_req(
    *queues: str,
    lease: Optional[float] = 30.0,
    wait: Optional[float] = None,
    max_jobs: Optional[int] = None,
    worker_id: Optional[str] = None,
) -> ReserveIn:
    req = ReserveIn()
    req.queues = list(queues)
    req.lease_duration = None if lease is None else sn(lease)
    req.wait_timeout = None if wait is None else sn(wait)
    req.max_jobs = max_jobs
    req.worker_id = worker_id
    return req


def lease_req(job_id: str, attempt: int, **fields: Any) -> LeaseIn:
    req = LeaseIn()
    req.job_id = job_id
    req.attempt = attempt
    for name, value in fields.items():
        setattr(req, name, value)
    return req


def make_state(**overrides: Any) -> tuple[QueueState, ManualClock]:
    clock = ManualClock(START_MS)
    config = ServerConfig().with_overrides(**overrides) if overrides else ServerConfig()
    return QueueState(config, clock=clock), clock


def enqueue_ids(state: QueueState, *jobs: EnqueueIn) -> list[str]:
    """Enqueue and return the job ids, failing on any rejection."""
    out = []
    for result in state.enqueue_batch(list(jobs)):
        assert isinstance(result, tuple), result
        out.append(result[0])
    return out


class BytesCodec(CodecBase):
    """A client codec that sends and returns raw message bytes."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


def raw_channel(server: SeppTestServer, **kwargs: Any) -> Channel:
    return Channel(server.host, server.port, codec=BytesCodec(), **kwargs)


async def raw_call(
    channel: Channel,
    rpc: str,
    data: bytes,
    *,
    metadata: Optional[dict[str, str]] = None,
    timeout: float = 10.0,
    service: str = "sepp.v1.QueueService",
) -> bytes:
    method: UnaryUnaryMethod[bytes, bytes] = UnaryUnaryMethod(
        channel, f"/{service}/{rpc}", bytes, bytes
    )
    return await method(data, metadata=metadata, timeout=timeout)
