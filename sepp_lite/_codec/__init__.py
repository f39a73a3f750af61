"""The hand-written protobuf codec for the hot sepp.v1 messages.

``client`` goes between domain values and request/response bytes for the client;
``server`` does the opposite directions for the in-process server. The generated
betterproto messages in ``sepp_lite._proto`` stay the schema-true reference: the
property tests hold both codecs to them.
"""
