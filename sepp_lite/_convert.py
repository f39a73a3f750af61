"""GetServerInfo through the betterproto-generated message: the one RPC cold enough to
keep off the hand-written codec. The only module besides the codec, the transport and
the test server that touches ``sepp_lite._proto``."""

from __future__ import annotations

from datetime import timedelta

from sepp_lite._proto.sepp import v1 as pb
from sepp_lite._time import EPOCH
from sepp_lite.errors import DecodeError, MalformedServerInfoError, ServerInfoError
from sepp_lite.types import ServerInfo


def _non_negative(value: timedelta) -> timedelta:
    return max(value, timedelta(0))


def server_info_from_message(msg: pb.GetServerInfoResponse) -> ServerInfo:
    """Raise :class:`ServerInfoError` for an answer the client cannot use."""
    if not msg.server_version:
        raise ServerInfoError("server_version is empty")
    server_time = msg.server_time
    if server_time < EPOCH:
        raise ServerInfoError(f"server_time {server_time.isoformat()} is before the epoch")
    return ServerInfo(
        version=msg.server_version,
        supported_protocol_versions=list(msg.supported_protocol_versions),
        server_time=server_time,
        restricts_encodings=msg.restricts_encodings,
        allowed_encodings=list(msg.allowed_encodings),
        max_payload_bytes=msg.max_payload_bytes,
        max_custom_entries=msg.max_custom_entries,
        max_custom_total_bytes=msg.max_custom_total_bytes,
        max_custom_key_bytes=msg.max_custom_key_bytes,
        max_queue_name_bytes=msg.max_queue_name_bytes,
        max_job_type_bytes=msg.max_job_type_bytes,
        max_idempotency_key_bytes=msg.max_idempotency_key_bytes,
        max_schedule_horizon=_non_negative(msg.max_schedule_horizon),
        max_enqueue_batch=msg.max_enqueue_batch,
        max_reserve_batch=msg.max_reserve_batch,
        max_reserve_queues=msg.max_reserve_queues,
        max_wait_timeout=_non_negative(msg.max_wait_timeout),
        max_lease_duration=_non_negative(msg.max_lease_duration),
        strict_queues=msg.strict_queues,
        dead_letter_retention_enabled=msg.dead_letter_retention_enabled,
    )


def decode_server_info(data: bytes) -> ServerInfo:
    """``GetServerInfoResponse`` bytes as a :class:`ServerInfo`."""
    try:
        msg = pb.GetServerInfoResponse().parse(data)
    except Exception as exc:  # the generated parser can fail in many ways on bad bytes
        raise DecodeError(f"cannot decode GetServerInfoResponse: {exc!r}") from exc
    try:
        return server_info_from_message(msg)
    except ServerInfoError as exc:
        raise MalformedServerInfoError(exc) from exc
    except (OverflowError, ValueError) as exc:
        raise DecodeError(f"cannot decode GetServerInfoResponse: {exc!r}") from exc


def encode_server_info(info: ServerInfo) -> bytes:
    """The server side: a :class:`ServerInfo` as ``GetServerInfoResponse`` bytes."""
    msg = pb.GetServerInfoResponse(
        server_version=info.version,
        supported_protocol_versions=list(info.supported_protocol_versions),
        server_time=info.server_time,
        restricts_encodings=info.restricts_encodings,
        allowed_encodings=list(info.allowed_encodings),
        max_payload_bytes=info.max_payload_bytes,
        max_custom_entries=info.max_custom_entries,
        max_custom_total_bytes=info.max_custom_total_bytes,
        max_custom_key_bytes=info.max_custom_key_bytes,
        max_queue_name_bytes=info.max_queue_name_bytes,
        max_job_type_bytes=info.max_job_type_bytes,
        max_idempotency_key_bytes=info.max_idempotency_key_bytes,
        max_schedule_horizon=info.max_schedule_horizon,
        max_enqueue_batch=info.max_enqueue_batch,
        max_reserve_batch=info.max_reserve_batch,
        max_reserve_queues=info.max_reserve_queues,
        max_wait_timeout=info.max_wait_timeout,
        max_lease_duration=info.max_lease_duration,
        strict_queues=info.strict_queues,
        dead_letter_retention_enabled=info.dead_letter_retention_enabled,
    )
    return bytes(msg)
