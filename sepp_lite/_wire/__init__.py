"""The wire band: how a call reaches the server and comes back, in gRPC over HTTP/2.

- ``http2/``: the client's own HTTP/2 connection, a plain HTTP/2 client that imports
  nothing else of sepp_lite.
- ``grpc``: gRPC's call rules on top of it, for both transports (statuses, message
  framing, trailers, grpc-timeout, a stream's failure as a call's).
- ``transport``: addresses, TLS, auth metadata, the ``Transport`` interface, and the
  client's own transport (connections, reconnecting, transparent retries).
- ``grpclib_transport``: the transport over a grpclib ``Channel``
  (``SeppClient.from_channel``), imported only when one is used.
- ``cork``: one TCP segment per loop iteration on grpclib's sockets (the test server,
  ``from_channel``).
- ``redact``: API keys kept out of hpack's DEBUG records.

The band stands on the bottom band (``_status``'s ``CallFailure``, the one failure of
both transports; ``errors``, for the two errors a connect raises) and on nothing above
it. This package imports none of its modules, so that importing one (``transport``)
never loads another (``grpclib_transport``, and grpclib with it).
"""
