"""The sepp.v1 wire schema as the codec uses it: every field's tag, the oneofs as tables
in both directions, and the DeadLetterCause numbering.

A field's tag is the varint that precedes its value on the wire, ``number << 3 |
wire_type``; a decoder that compares tags checks the field number and the wire type at
once, so a field sent with an unexpected wire type falls through to "unknown", as
protobuf parsers treat it. Every constant is named ``<MESSAGE>_<FIELD>`` in upper snake
case (``Job.job_type`` is ``JOB_JOB_TYPE``), the rule tests/test_codec_schema.py uses to
check each one against the descriptor compiled from ``proto/sepp/v1/queue.proto``.

The codec modules import these names: a module global costs a decode loop no more than a
literal would, where a class attribute (``Job.ID``) would cost a lookup per comparison.
"""

from __future__ import annotations

from sepp_lite.types import DeadLetterCause

# Wire types.
VARINT, I64, LEN, I32 = 0, 1, 2, 5


def tag(number: int, wire_type: int) -> int:
    """The tag of field ``number`` sent with ``wire_type``."""
    return number << 3 | wire_type


# google.protobuf.Timestamp and google.protobuf.Duration share one layout, so one reader
# and one writer serve both.
TIMESTAMP_SECONDS = tag(1, VARINT)
TIMESTAMP_NANOS = tag(2, VARINT)
DURATION_SECONDS = tag(1, VARINT)
DURATION_NANOS = tag(2, VARINT)

# The entry of every map<string, message> field (protobuf's rule for maps: the key is
# field 1, the value field 2): Job.custom and EnqueueRequest.custom.
MAP_ENTRY_KEY = tag(1, LEN)
MAP_ENTRY_VALUE = tag(2, LEN)

# -- values shared by several messages ------------------------------------------------

PRIMITIVE_VALUE_STRING_VALUE = tag(1, LEN)
PRIMITIVE_VALUE_DOUBLE_VALUE = tag(2, I64)
PRIMITIVE_VALUE_INT_VALUE = tag(3, VARINT)
PRIMITIVE_VALUE_BOOL_VALUE = tag(4, VARINT)

TRACE_CONTEXT_TRACEPARENT = tag(1, LEN)
TRACE_CONTEXT_TRACESTATE = tag(2, LEN)

PAYLOAD_DATA = tag(1, LEN)
PAYLOAD_ENCODING = tag(2, LEN)

# -- Job and Reserve ------------------------------------------------------------------

JOB_ID = tag(1, LEN)
JOB_JOB_TYPE = tag(2, LEN)
JOB_PAYLOAD = tag(3, LEN)
JOB_PRIORITY = tag(4, VARINT)
JOB_TRACE_CONTEXT = tag(5, LEN)
JOB_ENQUEUED_AT = tag(6, LEN)
JOB_ATTEMPT = tag(7, VARINT)
JOB_MAX_ATTEMPTS = tag(8, VARINT)
JOB_LEASE_EXPIRES_AT = tag(9, LEN)
JOB_CUSTOM = tag(10, LEN)
JOB_SCHEDULED_AT = tag(11, LEN)
JOB_QUEUE = tag(12, LEN)

RESERVE_REQUEST_QUEUES = tag(1, LEN)
RESERVE_REQUEST_WAIT_TIMEOUT = tag(2, LEN)
RESERVE_REQUEST_LEASE_DURATION = tag(3, LEN)
RESERVE_REQUEST_WORKER_ID = tag(4, LEN)
RESERVE_REQUEST_MAX_JOBS = tag(5, VARINT)

RESERVE_RESPONSE_JOBS = tag(1, LEN)

# -- Enqueue --------------------------------------------------------------------------

ENQUEUE_REQUEST_QUEUE = tag(1, LEN)
ENQUEUE_REQUEST_JOB_TYPE = tag(2, LEN)
ENQUEUE_REQUEST_PAYLOAD = tag(3, LEN)
ENQUEUE_REQUEST_IDEMPOTENCY_KEY = tag(4, LEN)
ENQUEUE_REQUEST_PRIORITY = tag(5, VARINT)
ENQUEUE_REQUEST_MAX_ATTEMPTS = tag(6, VARINT)
ENQUEUE_REQUEST_TRACE_CONTEXT = tag(7, LEN)
ENQUEUE_REQUEST_CUSTOM = tag(8, LEN)
ENQUEUE_REQUEST_SCHEDULED_AT = tag(9, LEN)

ENQUEUE_RESPONSE_JOB_ID = tag(1, LEN)
ENQUEUE_RESPONSE_DEDUPLICATED = tag(2, VARINT)

ENQUEUE_BATCH_REQUEST_JOBS = tag(1, LEN)
ENQUEUE_BATCH_RESPONSE_RESULTS = tag(1, LEN)

JOB_RESULT_SUCCESS = tag(1, LEN)
JOB_RESULT_REJECTION = tag(2, LEN)

ENQUEUE_ATOMIC_RESPONSE_SUCCESS = tag(1, LEN)
ENQUEUE_ATOMIC_RESPONSE_REJECTION = tag(2, LEN)
ENQUEUE_ATOMIC_SUCCESS_RESPONSES = tag(1, LEN)
BATCH_VALIDATION_FAILURE_ERRORS = tag(1, LEN)
JOB_VALIDATION_ERROR_INDEX = tag(1, VARINT)
JOB_VALIDATION_ERROR_REJECTION = tag(2, LEN)

# -- Rejections -----------------------------------------------------------------------

JOB_REJECTION_UNKNOWN_QUEUE = tag(1, LEN)
JOB_REJECTION_PAYLOAD_TOO_LARGE = tag(2, LEN)
JOB_REJECTION_ENCODING_NOT_ALLOWED = tag(3, LEN)
JOB_REJECTION_JOB_TYPE_NOT_ALLOWED = tag(4, LEN)
JOB_REJECTION_CUSTOM_ENTRIES_TOO_MANY = tag(5, LEN)
JOB_REJECTION_CUSTOM_MAP_TOO_LARGE = tag(6, LEN)
JOB_REJECTION_CUSTOM_KEY_TOO_LONG = tag(7, LEN)
JOB_REJECTION_QUEUE_NAME_TOO_LONG = tag(8, LEN)
JOB_REJECTION_JOB_TYPE_NAME_TOO_LONG = tag(9, LEN)
JOB_REJECTION_IDEMPOTENCY_KEY_TOO_LONG = tag(10, LEN)
JOB_REJECTION_SCHEDULED_TOO_FAR = tag(11, LEN)
JOB_REJECTION_INVALID_REQUEST = tag(12, LEN)
JOB_REJECTION_QUEUE_FULL = tag(13, LEN)
JOB_REJECTION_QUEUE_CLOSING = tag(14, LEN)

UNKNOWN_QUEUE_QUEUE = tag(1, LEN)
PAYLOAD_TOO_LARGE_LIMIT = tag(1, VARINT)
PAYLOAD_TOO_LARGE_ACTUAL = tag(2, VARINT)
ENCODING_NOT_ALLOWED_ENCODING = tag(1, LEN)
ENCODING_NOT_ALLOWED_ALLOWED = tag(2, LEN)
JOB_TYPE_NOT_ALLOWED_JOB_TYPE = tag(1, LEN)
JOB_TYPE_NOT_ALLOWED_ALLOWED = tag(2, LEN)
CUSTOM_ENTRIES_TOO_MANY_LIMIT = tag(1, VARINT)
CUSTOM_ENTRIES_TOO_MANY_ACTUAL = tag(2, VARINT)
CUSTOM_MAP_TOO_LARGE_LIMIT = tag(1, VARINT)
CUSTOM_MAP_TOO_LARGE_ACTUAL = tag(2, VARINT)
CUSTOM_KEY_TOO_LONG_KEY = tag(1, LEN)
CUSTOM_KEY_TOO_LONG_LIMIT = tag(2, VARINT)
CUSTOM_KEY_TOO_LONG_ACTUAL = tag(3, VARINT)
QUEUE_NAME_TOO_LONG_LIMIT = tag(1, VARINT)
QUEUE_NAME_TOO_LONG_ACTUAL = tag(2, VARINT)
JOB_TYPE_NAME_TOO_LONG_LIMIT = tag(1, VARINT)
JOB_TYPE_NAME_TOO_LONG_ACTUAL = tag(2, VARINT)
IDEMPOTENCY_KEY_TOO_LONG_LIMIT = tag(1, VARINT)
IDEMPOTENCY_KEY_TOO_LONG_ACTUAL = tag(2, VARINT)
SCHEDULED_TOO_FAR_HORIZON = tag(1, LEN)
SCHEDULED_TOO_FAR_ACTUAL = tag(2, LEN)
INVALID_REQUEST_MESSAGE = tag(1, LEN)
QUEUE_FULL_QUEUE = tag(1, LEN)
QUEUE_FULL_LIMIT = tag(2, VARINT)
QUEUE_CLOSING_QUEUE = tag(1, LEN)

# -- Lease operations -----------------------------------------------------------------

ACK_REQUEST_JOB_ID = tag(1, LEN)
ACK_REQUEST_ATTEMPT = tag(2, VARINT)
ACK_REQUEST_WORKER_ID = tag(3, LEN)
ACK_RESPONSE_JOB_ID = tag(1, LEN)

NACK_REQUEST_JOB_ID = tag(1, LEN)
NACK_REQUEST_ATTEMPT = tag(2, VARINT)
NACK_REQUEST_REASON = tag(3, LEN)
NACK_REQUEST_RETRY = tag(4, LEN)
NACK_REQUEST_WORKER_ID = tag(5, LEN)
NACK_RETRY_DEFAULT = tag(1, LEN)
NACK_RETRY_DELAY = tag(2, LEN)
NACK_RETRY_DEAD_LETTER = tag(3, LEN)
NACK_RESPONSE_JOB_ID = tag(1, LEN)
NACK_RESPONSE_DEAD_LETTERED = tag(2, VARINT)

EXTEND_REQUEST_JOB_ID = tag(1, LEN)
EXTEND_REQUEST_ATTEMPT = tag(2, VARINT)
EXTEND_REQUEST_LEASE_DURATION = tag(3, LEN)
EXTEND_REQUEST_WORKER_ID = tag(4, LEN)
EXTEND_RESPONSE_JOB_ID = tag(1, LEN)
EXTEND_RESPONSE_LEASE_EXPIRES_AT = tag(2, LEN)

# -- Dead letters ---------------------------------------------------------------------

DEAD_LETTER_RECORD_JOB = tag(1, LEN)
DEAD_LETTER_RECORD_CAUSE = tag(2, VARINT)
DEAD_LETTER_RECORD_FAILED_AT = tag(3, LEN)
DEAD_LETTER_RECORD_FINAL_ATTEMPT = tag(4, VARINT)
DEAD_LETTER_RECORD_LAST_REASON = tag(5, LEN)

DRAIN_DEAD_LETTERS_REQUEST_QUEUE = tag(1, LEN)
DRAIN_DEAD_LETTERS_REQUEST_MAX = tag(2, VARINT)
DRAIN_DEAD_LETTERS_RESPONSE_RECORDS = tag(1, LEN)

# -- Server info (GetServerInfoRequest has no fields) -----------------------------------

GET_SERVER_INFO_RESPONSE_SERVER_VERSION = tag(1, LEN)
GET_SERVER_INFO_RESPONSE_SUPPORTED_PROTOCOL_VERSIONS = tag(2, LEN)
GET_SERVER_INFO_RESPONSE_SERVER_TIME = tag(3, LEN)
GET_SERVER_INFO_RESPONSE_RESTRICTS_ENCODINGS = tag(4, VARINT)
GET_SERVER_INFO_RESPONSE_ALLOWED_ENCODINGS = tag(5, LEN)
GET_SERVER_INFO_RESPONSE_MAX_PAYLOAD_BYTES = tag(6, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_ENTRIES = tag(7, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_TOTAL_BYTES = tag(8, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_KEY_BYTES = tag(9, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_QUEUE_NAME_BYTES = tag(10, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_JOB_TYPE_BYTES = tag(11, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_IDEMPOTENCY_KEY_BYTES = tag(12, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_SCHEDULE_HORIZON = tag(13, LEN)
GET_SERVER_INFO_RESPONSE_MAX_ENQUEUE_BATCH = tag(14, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_RESERVE_BATCH = tag(15, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_RESERVE_QUEUES = tag(16, VARINT)
GET_SERVER_INFO_RESPONSE_MAX_WAIT_TIMEOUT = tag(17, LEN)
GET_SERVER_INFO_RESPONSE_MAX_LEASE_DURATION = tag(18, LEN)
GET_SERVER_INFO_RESPONSE_STRICT_QUEUES = tag(19, VARINT)
GET_SERVER_INFO_RESPONSE_DEAD_LETTER_RETENTION_ENABLED = tag(20, VARINT)

# -- Oneofs, both ways: member tag -> what the codec makes of it, and back ----------------
# PrimitiveValue.value and JobResult.outcome have no table: each of their members has its
# own reader and writer, which name the member tags one by one.

# JobRejection.reason by the name of the sepp_lite.errors class each member stands for
# (names, not classes: the classes load on first use, see sepp_lite/_rejections.py).
JOB_REJECTION_REASON_MEMBERS: dict[int, str] = {
    JOB_REJECTION_UNKNOWN_QUEUE: "UnknownQueue",
    JOB_REJECTION_PAYLOAD_TOO_LARGE: "PayloadTooLarge",
    JOB_REJECTION_ENCODING_NOT_ALLOWED: "EncodingNotAllowed",
    JOB_REJECTION_JOB_TYPE_NOT_ALLOWED: "JobTypeNotAllowed",
    JOB_REJECTION_CUSTOM_ENTRIES_TOO_MANY: "CustomEntriesTooMany",
    JOB_REJECTION_CUSTOM_MAP_TOO_LARGE: "CustomMapTooLarge",
    JOB_REJECTION_CUSTOM_KEY_TOO_LONG: "CustomKeyTooLong",
    JOB_REJECTION_QUEUE_NAME_TOO_LONG: "QueueNameTooLong",
    JOB_REJECTION_JOB_TYPE_NAME_TOO_LONG: "JobTypeNameTooLong",
    JOB_REJECTION_IDEMPOTENCY_KEY_TOO_LONG: "IdempotencyKeyTooLong",
    JOB_REJECTION_SCHEDULED_TOO_FAR: "ScheduledTooFar",
    JOB_REJECTION_INVALID_REQUEST: "InvalidRequest",
    JOB_REJECTION_QUEUE_FULL: "QueueFull",
    JOB_REJECTION_QUEUE_CLOSING: "QueueClosing",
}
JOB_REJECTION_REASON_TAGS = {name: member for member, name in JOB_REJECTION_REASON_MEMBERS.items()}

# NackRetry.strategy by the names the in-process server records (a RetryDirective of kind
# "after" is the delay member).
NACK_RETRY_STRATEGY_MEMBERS = {
    NACK_RETRY_DEFAULT: "default",
    NACK_RETRY_DELAY: "delay",
    NACK_RETRY_DEAD_LETTER: "dead_letter",
}
NACK_RETRY_STRATEGY_TAGS = {name: member for member, name in NACK_RETRY_STRATEGY_MEMBERS.items()}

ENQUEUE_ATOMIC_RESPONSE_OUTCOME_MEMBERS = {
    ENQUEUE_ATOMIC_RESPONSE_SUCCESS: "success",
    ENQUEUE_ATOMIC_RESPONSE_REJECTION: "rejection",
}
ENQUEUE_ATOMIC_RESPONSE_OUTCOME_TAGS = {
    name: member for member, name in ENQUEUE_ATOMIC_RESPONSE_OUTCOME_MEMBERS.items()
}

# -- Enums ------------------------------------------------------------------------------

# DeadLetterCause by wire number; numbers past the end read as UNSPECIFIED.
DEAD_LETTER_CAUSES = (
    DeadLetterCause.UNSPECIFIED,
    DeadLetterCause.ATTEMPTS_EXHAUSTED,
    DeadLetterCause.REJECTED,
    DeadLetterCause.LEASE_EXPIRED,
    DeadLetterCause.ADMIN,
)
