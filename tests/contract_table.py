"""The sepp.v1 wire contract as data, transcribed from the team's wire reference
(`spec/wire.md`): every message's fields as (number, name, type, label, oneof).

label: "optional" (proto3 explicit presence), "repeated", "map", or "" (implicit).
type: a scalar name, or the full name of a message or enum type.
"""

from __future__ import annotations

PACKAGE = "sepp.v1"
SERVICE = "QueueService"
RPCS = {
    "EnqueueBatch": ("sepp.v1.EnqueueBatchRequest", "sepp.v1.EnqueueBatchResponse"),
    "EnqueueAtomic": ("sepp.v1.EnqueueBatchRequest", "sepp.v1.EnqueueAtomicResponse"),
    "Reserve": ("sepp.v1.ReserveRequest", "sepp.v1.ReserveResponse"),
    "Ack": ("sepp.v1.AckRequest", "sepp.v1.AckResponse"),
    "Nack": ("sepp.v1.NackRequest", "sepp.v1.NackResponse"),
    "Extend": ("sepp.v1.ExtendRequest", "sepp.v1.ExtendResponse"),
    "DrainDeadLetters": ("sepp.v1.DrainDeadLettersRequest", "sepp.v1.DrainDeadLettersResponse"),
    "GetServerInfo": ("sepp.v1.GetServerInfoRequest", "sepp.v1.GetServerInfoResponse"),
}
ENUMS = {
    "DeadLetterCause": {
        "DEAD_LETTER_CAUSE_UNSPECIFIED": 0,
        "DEAD_LETTER_CAUSE_ATTEMPTS_EXHAUSTED": 1,
        "DEAD_LETTER_CAUSE_REJECTED": 2,
        "DEAD_LETTER_CAUSE_LEASE_EXPIRED": 3,
        "DEAD_LETTER_CAUSE_ADMIN": 4,
    },
}
MESSAGES: dict[str, list[tuple[int, str, str, str, str]]] = {
    "PrimitiveValue": [
        (1, "string_value", "string", "", "value"),
        (2, "double_value", "double", "", "value"),
        (3, "int_value", "int64", "", "value"),
        (4, "bool_value", "bool", "", "value"),
    ],
    "TraceContext": [
        (1, "traceparent", "string", "", ""),
        (2, "tracestate", "string", "optional", ""),
    ],
    "Payload": [
        (1, "data", "bytes", "", ""),
        (2, "encoding", "string", "", ""),
    ],
    "Job": [
        (1, "id", "string", "", ""),
        (2, "job_type", "string", "", ""),
        (3, "payload", "sepp.v1.Payload", "optional", ""),
        (4, "priority", "uint32", "", ""),
        (5, "trace_context", "sepp.v1.TraceContext", "optional", ""),
        (6, "enqueued_at", "google.protobuf.Timestamp", "", ""),
        (7, "attempt", "uint32", "", ""),
        (8, "max_attempts", "uint32", "", ""),
        (9, "lease_expires_at", "google.protobuf.Timestamp", "", ""),
        (10, "custom", "map<string, sepp.v1.PrimitiveValue>", "map", ""),
        (11, "scheduled_at", "google.protobuf.Timestamp", "", ""),
        (12, "queue", "string", "", ""),
    ],
    "JobRejection": [
        (1, "unknown_queue", "sepp.v1.UnknownQueue", "", "reason"),
        (2, "payload_too_large", "sepp.v1.PayloadTooLarge", "", "reason"),
        (3, "encoding_not_allowed", "sepp.v1.EncodingNotAllowed", "", "reason"),
        (4, "job_type_not_allowed", "sepp.v1.JobTypeNotAllowed", "", "reason"),
        (5, "custom_entries_too_many", "sepp.v1.CustomEntriesTooMany", "", "reason"),
        (6, "custom_map_too_large", "sepp.v1.CustomMapTooLarge", "", "reason"),
        (7, "custom_key_too_long", "sepp.v1.CustomKeyTooLong", "", "reason"),
        (8, "queue_name_too_long", "sepp.v1.QueueNameTooLong", "", "reason"),
        (9, "job_type_name_too_long", "sepp.v1.JobTypeNameTooLong", "", "reason"),
        (10, "idempotency_key_too_long", "sepp.v1.IdempotencyKeyTooLong", "", "reason"),
        (11, "scheduled_too_far", "sepp.v1.ScheduledTooFar", "", "reason"),
        (12, "invalid_request", "sepp.v1.InvalidRequest", "", "reason"),
        (13, "queue_full", "sepp.v1.QueueFull", "", "reason"),
        (14, "queue_closing", "sepp.v1.QueueClosing", "", "reason"),
    ],
    "UnknownQueue": [
        (1, "queue", "string", "", ""),
    ],
    "PayloadTooLarge": [
        (1, "limit", "uint64", "", ""),
        (2, "actual", "uint64", "", ""),
    ],
    "EncodingNotAllowed": [
        (1, "encoding", "string", "", ""),
        (2, "allowed", "string", "repeated", ""),
    ],
    "JobTypeNotAllowed": [
        (1, "job_type", "string", "", ""),
        (2, "allowed", "string", "repeated", ""),
    ],
    "CustomEntriesTooMany": [
        (1, "limit", "uint32", "", ""),
        (2, "actual", "uint32", "", ""),
    ],
    "CustomMapTooLarge": [
        (1, "limit", "uint64", "", ""),
        (2, "actual", "uint64", "", ""),
    ],
    "CustomKeyTooLong": [
        (1, "key", "string", "", ""),
        (2, "limit", "uint32", "", ""),
        (3, "actual", "uint64", "", ""),
    ],
    "QueueNameTooLong": [
        (1, "limit", "uint32", "", ""),
        (2, "actual", "uint64", "", ""),
    ],
    "JobTypeNameTooLong": [
        (1, "limit", "uint32", "", ""),
        (2, "actual", "uint64", "", ""),
    ],
    "IdempotencyKeyTooLong": [
        (1, "limit", "uint32", "", ""),
        (2, "actual", "uint64", "", ""),
    ],
    "ScheduledTooFar": [
        (1, "horizon", "google.protobuf.Duration", "", ""),
        (2, "actual", "google.protobuf.Timestamp", "", ""),
    ],
    "InvalidRequest": [
        (1, "message", "string", "", ""),
    ],
    "QueueFull": [
        (1, "queue", "string", "", ""),
        (2, "limit", "uint64", "", ""),
    ],
    "QueueClosing": [
        (1, "queue", "string", "", ""),
    ],
    "EnqueueRequest": [
        (1, "queue", "string", "", ""),
        (2, "job_type", "string", "", ""),
        (3, "payload", "sepp.v1.Payload", "optional", ""),
        (4, "idempotency_key", "string", "optional", ""),
        (5, "priority", "uint32", "optional", ""),
        (6, "max_attempts", "uint32", "optional", ""),
        (7, "trace_context", "sepp.v1.TraceContext", "optional", ""),
        (8, "custom", "map<string, sepp.v1.PrimitiveValue>", "map", ""),
        (9, "scheduled_at", "google.protobuf.Timestamp", "", ""),
    ],
    "EnqueueResponse": [
        (1, "job_id", "string", "", ""),
        (2, "deduplicated", "bool", "", ""),
    ],
    "EnqueueBatchRequest": [
        (1, "jobs", "sepp.v1.EnqueueRequest", "repeated", ""),
    ],
    "EnqueueBatchResponse": [
        (1, "results", "sepp.v1.JobResult", "repeated", ""),
    ],
    "JobResult": [
        (1, "success", "sepp.v1.EnqueueResponse", "", "outcome"),
        (2, "rejection", "sepp.v1.JobRejection", "", "outcome"),
    ],
    "EnqueueAtomicResponse": [
        (1, "success", "sepp.v1.EnqueueAtomicSuccess", "", "outcome"),
        (2, "rejection", "sepp.v1.BatchValidationFailure", "", "outcome"),
    ],
    "EnqueueAtomicSuccess": [
        (1, "responses", "sepp.v1.EnqueueResponse", "repeated", ""),
    ],
    "BatchValidationFailure": [
        (1, "errors", "sepp.v1.JobValidationError", "repeated", ""),
    ],
    "JobValidationError": [
        (1, "index", "uint32", "", ""),
        (2, "rejection", "sepp.v1.JobRejection", "", ""),
    ],
    "ReserveRequest": [
        (1, "queues", "string", "repeated", ""),
        (2, "wait_timeout", "google.protobuf.Duration", "", ""),
        (3, "lease_duration", "google.protobuf.Duration", "", ""),
        (4, "worker_id", "string", "optional", ""),
        (5, "max_jobs", "uint32", "optional", ""),
    ],
    "ReserveResponse": [
        (1, "jobs", "sepp.v1.Job", "repeated", ""),
    ],
    "AckRequest": [
        (1, "job_id", "string", "", ""),
        (2, "attempt", "uint32", "", ""),
        (3, "worker_id", "string", "optional", ""),
    ],
    "AckResponse": [
        (1, "job_id", "string", "", ""),
    ],
    "NackRequest": [
        (1, "job_id", "string", "", ""),
        (2, "attempt", "uint32", "", ""),
        (3, "reason", "string", "optional", ""),
        (4, "retry", "sepp.v1.NackRetry", "optional", ""),
        (5, "worker_id", "string", "optional", ""),
    ],
    "NackRetry": [
        (1, "default", "google.protobuf.Empty", "", "strategy"),
        (2, "delay", "google.protobuf.Duration", "", "strategy"),
        (3, "dead_letter", "google.protobuf.Empty", "", "strategy"),
    ],
    "NackResponse": [
        (1, "job_id", "string", "", ""),
        (2, "dead_lettered", "bool", "", ""),
    ],
    "ExtendRequest": [
        (1, "job_id", "string", "", ""),
        (2, "attempt", "uint32", "", ""),
        (3, "lease_duration", "google.protobuf.Duration", "", ""),
        (4, "worker_id", "string", "optional", ""),
    ],
    "ExtendResponse": [
        (1, "job_id", "string", "", ""),
        (2, "lease_expires_at", "google.protobuf.Timestamp", "", ""),
    ],
    "DeadLetterRecord": [
        (1, "job", "sepp.v1.Job", "", ""),
        (2, "cause", "sepp.v1.DeadLetterCause", "", ""),
        (3, "failed_at", "google.protobuf.Timestamp", "", ""),
        (4, "final_attempt", "uint32", "", ""),
        (5, "last_reason", "string", "optional", ""),
    ],
    "DrainDeadLettersRequest": [
        (1, "queue", "string", "optional", ""),
        (2, "max", "uint32", "optional", ""),
    ],
    "DrainDeadLettersResponse": [
        (1, "records", "sepp.v1.DeadLetterRecord", "repeated", ""),
    ],
    "GetServerInfoRequest": [],
    "GetServerInfoResponse": [
        (1, "server_version", "string", "", ""),
        (2, "supported_protocol_versions", "string", "repeated", ""),
        (3, "server_time", "google.protobuf.Timestamp", "", ""),
        (4, "restricts_encodings", "bool", "", ""),
        (5, "allowed_encodings", "string", "repeated", ""),
        (6, "max_payload_bytes", "uint64", "", ""),
        (7, "max_custom_entries", "uint32", "", ""),
        (8, "max_custom_total_bytes", "uint64", "", ""),
        (9, "max_custom_key_bytes", "uint32", "", ""),
        (10, "max_queue_name_bytes", "uint32", "", ""),
        (11, "max_job_type_bytes", "uint32", "", ""),
        (12, "max_idempotency_key_bytes", "uint32", "", ""),
        (13, "max_schedule_horizon", "google.protobuf.Duration", "", ""),
        (14, "max_enqueue_batch", "uint32", "", ""),
        (15, "max_reserve_batch", "uint32", "", ""),
        (16, "max_reserve_queues", "uint32", "", ""),
        (17, "max_wait_timeout", "google.protobuf.Duration", "", ""),
        (18, "max_lease_duration", "google.protobuf.Duration", "", ""),
        (19, "strict_queues", "bool", "", ""),
        (20, "dead_letter_retention_enabled", "bool", "", ""),
    ],
}
