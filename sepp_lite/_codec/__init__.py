"""The hand-written protobuf codec for sepp.v1, both directions: the client's requests
and responses, and the in-process server's (:mod:`sepp_lite.testing`).

``schema``        every field's tag, the oneof tables both ways, the enum numbering
``_wire``         varints, tags, lengths, Timestamp/Duration bodies, field writers
``values``        what several messages carry: PrimitiveValue and custom map entries,
                  Payload, TraceContext, Timestamps read into datetimes
``enqueue``       EnqueueBatchRequest, EnqueueBatchResponse, EnqueueAtomicResponse
``job``           ReserveRequest, ReserveResponse and its Jobs
``lease``         Ack, Nack and Extend requests and responses
``dead_letters``  DrainDeadLettersRequest and DrainDeadLettersResponse
``server_info``   GetServerInfoRequest and GetServerInfoResponse
``rejections``    JobRejection, inside the enqueue responses

Names say the message and the direction. A whole message is
``encode_<message>`` / ``decode_<message>``, after the schema's message name, so a
``*_request`` is encoded by the client and decoded by the server, a ``*_response`` the
other way round (``encode_nack_request`` in the client, ``decode_nack_request`` in the
server). ``decode_*`` functions raise only :class:`~sepp_lite.errors.DecodeError` on
bad bytes. A message nested in another is ``write_<message>`` / ``read_<message>(data,
start, stop)`` (a body, unguarded: the enclosing ``decode_*`` turns its failures into
DecodeError), and ``*_field`` returns a whole field, tag and length included.

Decoded requests are ``*In`` records (slotted classes, or a NamedTuple) that keep field
presence (``None`` for an absent field); decoded responses are domain values, or
NamedTuples (``JobMessage``, ``DeadLetterMessage`` before the client's checks, and the
Nack and Extend answers). The generated betterproto messages in ``sepp_lite._proto`` stay the
schema-true reference: the tests hold this codec to them and to Google's protobuf.
"""
