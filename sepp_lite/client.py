"""SeppClient: one short coroutine per RPC, with sepp-py 0.1.0's API.

Producer: validate (``_validate``) -> encode (``_codec``) -> one retry loop (``_retry``) -> the
transport (``_wire.transport``: our own HTTP/2, or a grpclib channel). Consumer: ``reserve``
hands out jobs bound to a :class:`Lease`; ``ack``/``nack``/``extend`` settle or keep them.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Optional

from sepp_lite import _coalesce, _codec, _connect_defaults, _log, _otel, _validate, errors
from sepp_lite._codec.dead_letters import (
    decode_drain_dead_letters_response,
    encode_drain_dead_letters_request,
)
from sepp_lite._codec.enqueue import (
    decode_enqueue_atomic_response,
    decode_enqueue_batch_response,
    encode_enqueue_batch_request,
    trace_context_field,
)
from sepp_lite._codec.job import decode_reserve_response, encode_reserve_request
from sepp_lite._codec.lease import (
    decode_ack_response,
    decode_extend_response,
    decode_nack_response,
    encode_ack_request,
    encode_extend_request,
    encode_nack_request,
    nack_retry_field,
)
from sepp_lite._codec.server_info import decode_get_server_info_response
from sepp_lite._lease import Lease
from sepp_lite._retry import RETRIED_BY_POLICY, OnRetry, call_with_retry
from sepp_lite._sending import MAX_MESSAGE_BYTES, BatchLimits, job_rejection
from sepp_lite._status import CallFailure, Status
from sepp_lite._time import Duration, as_timedelta, datetime_to_ms
from sepp_lite._wire.http2 import Keepalive
from sepp_lite._wire.redact import protect_credentials_in_logs
from sepp_lite._wire.transport import (
    Http2Transport,
    Transport,
    bearer_metadata,
    parse_address,
    tls_context,
)
from sepp_lite.types import (
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    JobCtx,
    ReserveOptions,
    RetryDirective,
    RetryPolicy,
    ServerInfo,
    bind_lease,
    check_enqueue_request,
    reserve_request,
)

if TYPE_CHECKING:
    from grpclib.client import Channel

__all__ = ["Lease", "RetryDirective", "RetryPolicy", "SeppClient"]

logger = _log.logger()

_DEFAULT_RPC_TIMEOUT = _connect_defaults.RPC_TIMEOUT
# A reserve's deadline is its long-poll wait plus this much, so the client never gives
# up before the server's own wait window ends.
_RESERVE_SLACK_S = 10.0
# An enqueue() of a job with a larger payload goes out in a call of its own even while
# others share calls: it saves little, and the size limits stay those of a lone call.
_LARGE_JOB_BYTES = 1024 * 1024

assert _codec  # the package docstring documents the codec's layout


class SeppClient:
    """An asyncio client for one sepp server; every RPC method is a coroutine.

    Create one with :meth:`connect` (address, auth, TLS, retries, limits) or wrap a
    grpclib ``Channel`` with :meth:`from_channel`; close it with :meth:`close` or use
    ``async with``. Durations accept ``timedelta`` or float seconds.
    """

    def __init__(
        self,
        channel: Channel | Transport,
        retry_policy: RetryPolicy | None = None,
        auth_metadata: Iterable[tuple[str, str]] | None = None,
        rpc_timeout: Duration = _DEFAULT_RPC_TIMEOUT,
        *,
        max_receive_message_bytes: int = MAX_MESSAGE_BYTES,
        check_payload_limit: bool = True,
        coalesce_enqueues: bool | None = None,
        max_enqueue_batches_in_flight: int = _coalesce.DEFAULT_MAX_IN_FLIGHT,
        max_enqueues_waiting: int = _coalesce.DEFAULT_MAX_WAITING,
    ) -> None:
        _coalesce.check_options(max_enqueue_batches_in_flight, max_enqueues_waiting)
        self._rpc_timeout = as_timedelta(rpc_timeout, "rpc_timeout", positive=True).total_seconds()
        self._retry_policy = retry_policy or RetryPolicy()
        metadata = tuple((str(key), str(value)) for key, value in (auth_metadata or ()))
        if metadata:
            protect_credentials_in_logs()  # before any header is encoded
        if isinstance(channel, Http2Transport):
            if metadata:
                raise ValueError("auth metadata is part of the transport: pass it there")
            self._transport: Transport = channel
            self._auth = channel.authenticated
        else:
            # A grpclib Channel: the adapter (and grpclib) load only on this path.
            from sepp_lite._wire.grpclib_transport import GrpclibTransport

            self._transport = GrpclibTransport(
                channel,  # type: ignore[arg-type]
                metadata=metadata,
                max_receive=max_receive_message_bytes,
            )
            self._auth = bool(metadata)
        self._server_info: ServerInfo | None = None
        self._check_payload_limit = check_payload_limit
        self._coalescer: _coalesce.Coalescer | None = None
        if _coalescing(coalesce_enqueues):
            self._coalescer = _coalesce.Coalescer(
                self._send_batch,
                self._deadline_error,
                max_in_flight=max_enqueue_batches_in_flight,
                max_waiting=max_enqueues_waiting,
            )

    @classmethod
    async def connect(
        cls,
        addr: str,
        *,
        api_key: str | None = None,
        retry_policy: RetryPolicy | None = None,
        tls: bool = False,
        tls_ca_cert: bytes | None = None,
        tls_domain: str | None = None,
        credentials: ssl.SSLContext | None = None,
        connect_timeout: Duration = _connect_defaults.CONNECT_TIMEOUT,
        rpc_timeout: Duration = _connect_defaults.RPC_TIMEOUT,
        max_receive_message_bytes: int | None = None,
        keepalive_time: Duration = _connect_defaults.KEEPALIVE_TIME,
        keepalive_timeout: Duration = _connect_defaults.KEEPALIVE_TIMEOUT,
        check_payload_limit: bool = True,
        coalesce_enqueues: bool | None = None,
        max_enqueue_batches_in_flight: int = _connect_defaults.MAX_ENQUEUE_BATCHES_IN_FLIGHT,
        max_enqueues_waiting: int = _connect_defaults.MAX_ENQUEUES_WAITING,
    ) -> SeppClient:
        """Connect to the server at ``addr`` and return a ready client.

        ``addr`` is ``host:port``, ``http://host:port`` (plaintext) or
        ``https://host[:port]`` (TLS). TLS is also on with ``tls=True`` (system roots),
        ``tls_ca_cert`` (PEM bytes of a private CA), ``tls_domain`` (the name the
        server's certificate must carry) or ``credentials`` (your own
        ``ssl.SSLContext``, used as given apart from ALPN ``h2``). ``api_key`` is sent
        as ``authorization: Bearer <key>`` on every call.

        ``max_receive_message_bytes`` defaults to 16 MiB (sepp-py leaves grpc's 4 MiB,
        which can strand leased jobs on a large reserve). ``keepalive_time`` and
        ``keepalive_timeout`` (sepp_lite additions) tune the HTTP/2 pings that detect a
        dead server: every 30 s, 10 s to answer. Once the client knows the server's
        limits (after :meth:`get_server_info`, which a Worker calls at start), a job
        whose payload is over the advertised ``max_payload_bytes`` is not sent: it
        gets the server's ``PayloadTooLarge`` rejection without the round trip. That
        value is the server's global default, so pass ``check_payload_limit=False`` if
        some queue is configured to accept more.

        ``coalesce_enqueues`` (on unless the environment sets ``SEPP_LITE_COALESCE=0``)
        lets concurrent :meth:`enqueue` calls share EnqueueBatch calls: see
        :meth:`enqueue`. At most ``max_enqueue_batches_in_flight`` such shared calls are
        in flight at once, and at most ``max_enqueues_waiting`` calls wait to be sent;
        further callers wait for room.

        Raises :class:`~sepp_lite.errors.ConnectError` when the server cannot be
        reached within ``connect_timeout``, and
        :class:`~sepp_lite.errors.InvalidApiKeyError` for a key that cannot be a
        header value; ``ValueError`` for a malformed address or option.
        """
        target = parse_address(addr)
        as_timedelta(rpc_timeout, "rpc_timeout", positive=True)  # checked before connecting
        _coalesce.check_options(max_enqueue_batches_in_flight, max_enqueues_waiting)
        _coalescing(coalesce_enqueues)
        metadata = bearer_metadata(api_key)
        use_tls = bool(tls or target.tls or tls_ca_cert or tls_domain or credentials)
        if metadata and not use_tls:
            logger.warning(
                "an API key is configured without TLS: it will cross the network in plaintext"
            )
        keepalive = Keepalive(
            as_timedelta(keepalive_time, "keepalive_time", positive=True).total_seconds(),
            as_timedelta(keepalive_timeout, "keepalive_timeout", positive=True).total_seconds(),
        )
        receive_limit = _validate.receive_limit(max_receive_message_bytes, MAX_MESSAGE_BYTES)
        timeout = as_timedelta(connect_timeout, "connect_timeout", positive=True).total_seconds()
        if metadata:
            protect_credentials_in_logs()
        transport = Http2Transport(
            target,
            label=addr,
            ssl_context=_client_tls(use_tls, tls_ca_cert, credentials),
            tls_domain=tls_domain,
            metadata=metadata,
            max_receive=receive_limit,
            keepalive=keepalive,
            connect_timeout=timeout,
        )
        await transport.connect()
        logger.info(
            "connected to the sepp server at %s (tls=%s, auth=%s)", addr, use_tls, bool(metadata)
        )
        return cls(
            transport,
            retry_policy,
            rpc_timeout=rpc_timeout,
            check_payload_limit=check_payload_limit,
            coalesce_enqueues=coalesce_enqueues,
            max_enqueue_batches_in_flight=max_enqueue_batches_in_flight,
            max_enqueues_waiting=max_enqueues_waiting,
        )

    @classmethod
    def from_channel(
        cls,
        channel: Channel,
        *,
        retry_policy: RetryPolicy | None = None,
        rpc_timeout: Duration = _DEFAULT_RPC_TIMEOUT,
    ) -> SeppClient:
        """Wrap an existing grpclib ``Channel`` (no auth is sent). Calls then go through
        grpclib, which is imported only on this path."""
        return cls(channel, retry_policy=retry_policy, rpc_timeout=rpc_timeout)

    async def close(self) -> None:
        """Close the connection; calls made afterwards raise ``RuntimeError``."""
        await self._transport.close()
        if self._coalescer is not None:
            await self._coalescer.close()

    async def __aenter__(self) -> SeppClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        transport = self._transport
        return f"SeppClient({transport.label!r}, tls={transport.tls}, auth={self._auth})"

    @property
    def connections_opened(self) -> int:
        """How many connections to the server this client has opened so far: 1 after
        :meth:`connect`, one more after each reconnect (a lost connection, a server's
        GOAWAY)."""
        return self._transport.connections_opened

    @property
    def enqueues_waiting(self) -> int:
        """How many :meth:`enqueue` calls wait to share a call to the server (at most
        ``max_enqueues_waiting``, and for a moment more when the server refused a shared
        call for its size and its callers wait to be sent again); 0 without
        coalescing."""
        coalescer = self._coalescer
        return coalescer.waiting if coalescer is not None else 0

    @property
    def server_info(self) -> ServerInfo | None:
        """The answer of the last :meth:`get_server_info` call on this client, if any."""
        return self._server_info

    # -- plumbing ---------------------------------------------------------------------

    async def _rpc(
        self,
        method: str,
        request: bytes,
        *,
        kind: errors.CallKind = "generic",
        all_keyed: bool = True,
        timeout: float | None = None,
        deadline_at: float | None = None,
        on_retry: OnRetry | None = None,
    ) -> bytes:
        """One logical call, the one path of every call of this client (its coalescer's
        too): a deadline for all its attempts (``timeout`` seconds from now, unless
        ``deadline_at`` is given), retried per the policy when ``RETRIED_BY_POLICY`` says
        it applies to ``method`` (``on_retry`` told of each retry), a failure raised as
        ``errors.map_failure`` says for ``kind``."""
        if len(request) > MAX_MESSAGE_BYTES:
            raise errors.RequestTooLargeError.before_sending(
                method, len(request), MAX_MESSAGE_BYTES
            )
        seconds = self._rpc_timeout if timeout is None else timeout
        if deadline_at is None:
            deadline_at = asyncio.get_running_loop().time() + seconds
        if not RETRIED_BY_POLICY[method] or self._retry_policy.max_attempts <= 1:
            return await self._unary(method, request, deadline_at, kind, seconds)

        async def attempt() -> bytes:
            return await self._unary(method, request, deadline_at, kind, seconds)

        return await call_with_retry(
            method,
            attempt,
            self._retry_policy,
            deadline_at,
            all_keyed=all_keyed,
            on_retry=on_retry,
        )

    async def _send_batch(
        self, request: bytes, count: int, deadline_at: float, all_keyed: bool, on_retry: OnRetry
    ) -> list[EnqueueAck | errors.JobRejection]:
        """An EnqueueBatch call of ``count`` jobs the coalescer shares between its
        callers, until ``deadline_at``: sent, retried and mapped by :meth:`_rpc`, its
        answer checked as :meth:`enqueue_batch` checks its own."""
        data = await self._rpc(
            "EnqueueBatch", request, all_keyed=all_keyed, deadline_at=deadline_at, on_retry=on_retry
        )
        return _batch_results(data, count)

    def _deadline_error(self, method: str, *, sent: bool) -> errors.SeppError:
        """The error of a ``method`` call at its deadline (``errors.map_failure``'s), for
        a call that waited in the coalescer: ``sent`` says whether it went out."""
        what = "deadline exceeded" if sent else "deadline exceeded before the call was sent"
        failure = CallFailure(Status.DEADLINE_EXCEEDED, what, local=True, ambiguous=sent)
        where = f"{method} to {self._transport.label}"
        return errors.map_failure(failure, "generic", where, self._rpc_timeout)

    async def _unary(
        self, method: str, request: bytes, deadline_at: float, kind: errors.CallKind, seconds: float
    ) -> bytes:
        """One attempt on the transport; its failure as a SeppError."""
        transport = self._transport
        trace = _otel.call_metadata() if _otel.AVAILABLE else ()
        try:
            return await transport.unary(method, request, deadline_at, trace)
        except CallFailure as failure:
            where = f"{method} to {transport.label}"
            error = errors.map_failure(failure, kind, where, seconds)
            raise error from failure.__cause__ or failure

    # -- producing --------------------------------------------------------------------

    def _checked_batch(
        self, jobs: Iterable[EnqueueRequest]
    ) -> tuple[list[EnqueueRequest], dict[int, errors.JobRejection]]:
        """The jobs as a list, every one checked (a job that cannot be sent raises),
        and the ones refused here by their index: a payload over the server's
        advertised limit gets the server's own ``PayloadTooLarge``."""
        batch = list(jobs)
        if not batch:
            raise errors.EmptyBatchError()
        for job in batch:
            check_enqueue_request(job)
        refused: dict[int, errors.JobRejection] = {}
        info = self._server_info
        if info is not None and info.max_payload_bytes and self._check_payload_limit:
            for index, job in enumerate(batch):
                rejection = job_rejection(job, info, names=False)
                if rejection is not None:
                    refused[index] = rejection
        return batch, refused

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest]
    ) -> list[EnqueueAck | errors.JobRejection]:
        """Enqueue jobs best-effort: one result per job, in order, an
        :class:`~sepp_lite.types.EnqueueAck` or a
        :class:`~sepp_lite.errors.JobRejection` value.

        Every job is checked and encoded before anything is sent (``TypeError`` or
        ``ValueError`` for a bad one); no jobs raise
        :class:`~sepp_lite.errors.EmptyBatchError`. Once the client knows the server's
        limits (see :meth:`connect`), a job whose payload is over them is not sent: its
        result is the :class:`~sepp_lite.errors.PayloadTooLarge` the server would have
        given, and the other jobs go out. Whole-call failures raise a
        :class:`~sepp_lite.errors.ClientError`. Retried per the policy, except that when
        some job has no idempotency key, failures the server may have applied are not
        retried (a retry could duplicate it).
        """
        batch, refused = self._checked_batch(jobs)
        with _otel.client_span("sepp.enqueue", {"sepp.batch_size": len(batch)}):
            sent, request = _encoded_batch(batch, refused)
            if not sent:
                return [refused[index] for index in range(len(batch))]
            data = await self._rpc("EnqueueBatch", request, all_keyed=_all_keyed(sent))
        answers = iter(_batch_results(data, len(sent)))
        return [
            refused[index] if index in refused else next(answers) for index in range(len(batch))
        ]

    async def enqueue(self, job: EnqueueRequest) -> EnqueueAck:
        """Enqueue one job; raise :class:`~sepp_lite.errors.JobRejectedError` when the
        server refuses it, or would (otherwise as :meth:`enqueue_batch`).

        With coalescing on (see :meth:`connect`), a call made while another enqueue
        call of this client is in flight waits for it and then goes out in one
        EnqueueBatch call with the others that waited; a call made while none is in
        flight goes out at once. Each caller still gets its own ack or rejection, its
        own deadline, retries and span; a call cancelled before its batch is sent is
        never sent, and one cancelled after may still be enqueued (as a call cancelled
        after it went out). The documentation's "Producing" page
        (docs/producing.md, "Many producers") has the details."""
        coalescer = self._coalescer
        if coalescer is None:
            result = (await self.enqueue_batch([job]))[0]
        elif coalescer.idle:
            result = await self._enqueue_alone(job, coalescer)
        else:
            result = await self._enqueue_coalesced(job, coalescer)
        if not isinstance(result, EnqueueAck):
            raise errors.JobRejectedError(result)
        return result

    async def _enqueue_alone(
        self, job: EnqueueRequest, coalescer: _coalesce.Coalescer
    ) -> EnqueueAck | errors.JobRejection:
        """One job sent at once in a call of its own; calls made meanwhile wait for it."""
        coalescer.alone_started()
        try:
            return (await self.enqueue_batch([job]))[0]
        finally:
            coalescer.alone_ended()

    async def _enqueue_coalesced(
        self, job: EnqueueRequest, coalescer: _coalesce.Coalescer
    ) -> EnqueueAck | errors.JobRejection:
        """One job that shares an EnqueueBatch call (see ``_coalesce``), checked and
        encoded as :meth:`enqueue_batch` would, in this call's own span."""
        deadline_at = asyncio.get_running_loop().time() + self._rpc_timeout
        batch, refused = self._checked_batch([job])
        payload = batch[0].payload
        if payload is not None and len(payload.data) > _LARGE_JOB_BYTES:
            return await self._enqueue_alone(job, coalescer)  # gains nothing from sharing
        with _otel.client_span("sepp.enqueue", {"sepp.batch_size": 1}):
            if refused:
                return refused[0]
            await coalescer.take_room(deadline_at)
            try:
                part = encode_enqueue_batch_request(batch, _injected_trace())
            except BaseException:
                coalescer.release_room()
                raise
            return await coalescer.enqueue(part, bool(job.idempotency_key), deadline_at)

    async def enqueue_atomic(self, jobs: Iterable[EnqueueRequest]) -> list[EnqueueAck]:
        """Enqueue all jobs or none: on success one ack per job, in order; if any job is
        refused nothing is written and :class:`~sepp_lite.errors.BatchValidationError`
        lists every refusal with its index. A payload over the server's known limit is
        such a refusal found here: then nothing is sent, and the error lists those
        jobs. Checks and retries as :meth:`enqueue_batch`."""
        batch, refused = self._checked_batch(jobs)
        with _otel.client_span("sepp.enqueue_atomic", {"sepp.batch_size": len(batch)}):
            trace = _injected_trace()
            request = encode_enqueue_batch_request(batch, trace)
            if len(request) > MAX_MESSAGE_BYTES:
                _refuse_oversized(batch, refused, trace)
            if refused:
                raise errors.BatchValidationError(
                    [errors.JobValidationError(i, refused[i]) for i in sorted(refused)]
                )
            data = await self._rpc("EnqueueAtomic", request, all_keyed=_all_keyed(batch))
        outcome = decode_enqueue_atomic_response(data)
        if outcome is None:
            raise errors.MalformedResponseError("EnqueueAtomic answered with no outcome")
        kind, items = outcome
        if kind == "rejection":
            raise errors.BatchValidationError(items)  # type: ignore[arg-type]
        if len(items) != len(batch):
            raise errors.BatchResultCountMismatchError(len(batch), len(items))
        return items  # type: ignore[return-value]

    # -- consuming --------------------------------------------------------------------

    async def reserve(self, opts: ReserveOptions) -> list[Job] | None:
        """Long-poll for up to ``opts.max_jobs`` jobs (the server's default is 1),
        waiting up to ``opts.wait_timeout``. Returns a non-empty list of leased jobs,
        or ``None`` when none came. Never retried. A job the client cannot read is
        skipped with a warning (its lease lapses on the server).

        Raises :class:`~sepp_lite.errors.UnknownQueuesError` when the server is in
        strict mode and a queue is not declared, else a
        :class:`~sepp_lite.errors.ClientError`.
        """
        if not isinstance(opts, ReserveOptions):
            raise TypeError(f"reserve() takes ReserveOptions, got {type(opts).__name__}")
        # Checked again only if a field changed since it was checked (it is mutable).
        request = reserve_request(opts, encode_reserve_request)
        timeout = opts.wait_timeout.total_seconds() + _RESERVE_SLACK_S
        attributes = {"sepp.worker_id": opts.worker_id or "<none>"}
        with _otel.client_span("sepp.reserve", attributes) as span:
            data = await self._rpc("Reserve", request, kind="reserve", timeout=timeout)
            jobs, problems = decode_reserve_response(data)
            if span is not None:
                span.set_attribute("sepp.jobs", len(jobs))
        for problem in problems:
            logger.warning("skipping malformed job in reserve response: %s", problem)
        jobs = _jobs_with_uuids(jobs)
        worker_id = opts.worker_id
        for job in jobs:
            ctx = job.ctx
            expires_at_ms = datetime_to_ms(ctx.lease_expires_at)
            bind_lease(ctx, Lease(self, ctx.id, ctx.attempt, expires_at_ms, worker_id))
        return jobs or None

    async def ack(self, ctx: JobCtx) -> None:
        """Acknowledge a job: it is done and deleted. Raises
        :class:`~sepp_lite.errors.JobNotFoundError` or
        :class:`~sepp_lite.errors.AttemptMismatchError` when this delivery no longer
        holds the lease. Retried per the policy (so a JobNotFound may follow an earlier
        attempt that succeeded but lost its answer)."""
        worker_id = _worker_id(ctx)
        request = encode_ack_request(ctx.id, ctx.attempt, worker_id)
        with _otel.client_span("sepp.ack", _lease_attributes(ctx, worker_id)):
            decode_ack_response(await self._release("Ack", request, ctx))

    async def nack(
        self,
        ctx: JobCtx,
        retry: RetryDirective = RetryDirective.DEFAULT,
        reason: str = "",
    ) -> bool:
        """Report a failed job. ``retry`` says what happens next (the queue's policy, a
        delay, or dead-lettering); ``reason`` is recorded (an empty one is not sent).
        Returns True when the job was dead-lettered (directive, or last attempt).
        Lease errors and retries as :meth:`ack`."""
        if not isinstance(retry, RetryDirective):
            raise TypeError(f"retry must be a RetryDirective, got {type(retry).__name__}")
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        worker_id = _worker_id(ctx)
        retry_field = nack_retry_field(retry.kind, retry.delay)
        request = encode_nack_request(ctx.id, ctx.attempt, reason or None, retry_field, worker_id)
        with _otel.client_span("sepp.nack", _lease_attributes(ctx, worker_id)):
            data = await self._release("Nack", request, ctx)
        return decode_nack_response(data)[1]

    async def _release(self, method: str, request: bytes, ctx: JobCtx) -> bytes:
        """An Ack or Nack call; the delivery's lease is marked released once the server
        answered it or said the lease is gone, so a Worker never settles it again."""
        lease = ctx.lease
        if lease is not None:
            lease.settle_started()
        try:
            data = await self._rpc(method, request, kind="lease")
        except errors.LeaseError:
            _mark_released(ctx)
            raise
        finally:
            if lease is not None:
                lease.settle_ended()
        _mark_released(ctx)
        return data

    async def extend(self, ctx: JobCtx, extension: Duration) -> datetime:
        """Extend a job's lease to ``extension`` from now; return the new expiry. Unlike
        :meth:`JobCtx.extend <sepp_lite.types.JobCtx.extend>` it does not update the
        lease the worker's auto-extend follows. Lease errors and retries as
        :meth:`ack`."""
        lease = as_timedelta(extension, "extension", positive=True)
        return await self.extend_lease(ctx.id, ctx.attempt, lease, _worker_id(ctx))

    async def extend_lease(
        self, job_id: str, attempt: int, extension: Duration, worker_id: Optional[str] = None
    ) -> datetime:
        """The Extend call by delivery rather than by ctx: extend the lease of attempt
        ``attempt`` of job ``job_id``, reserved with ``worker_id``, to ``extension`` from
        now, and return the new expiry. :meth:`extend` and every :class:`Lease`
        (``JobCtx.extend``, a Worker's lease keeper) call it. Lease errors and retries
        as :meth:`ack`."""
        lease = as_timedelta(extension, "extension", positive=True)
        request = encode_extend_request(job_id, attempt, lease, worker_id)
        attributes = {
            "sepp.job_id": job_id,
            "sepp.attempt": attempt,
            "sepp.worker_id": worker_id or "<none>",
        }
        with _otel.client_span("sepp.extend", attributes):
            data = await self._rpc("Extend", request, kind="lease")
        expiry = decode_extend_response(data)[1]
        if expiry is None:
            raise errors.MalformedResponseError("Extend answered without a valid lease expiry")
        return expiry

    # -- the rest ---------------------------------------------------------------------

    async def get_server_info(self) -> ServerInfo:
        """The server's version and global limits (also kept as :attr:`server_info`).
        Raises :class:`~sepp_lite.errors.MalformedServerInfoError` for an unusable
        answer."""
        with _otel.client_span("sepp.get_server_info"):
            data = await self._rpc("GetServerInfo", b"")
        info = self._server_info = decode_get_server_info_response(data)
        if self._coalescer is not None:
            self._coalescer.limits.jobs = BatchLimits.of(info).jobs
        return info

    async def drain_dead_letters(
        self, queue: str | None = None, max_records: int = 1
    ) -> list[DeadLetterRecord]:
        """Remove and return up to ``max_records`` dead-lettered jobs, oldest first,
        optionally of one ``queue``. Destructive, so never retried: a lost answer loses
        those records. ``max_records=0`` sends nothing and returns ``[]``. An empty list
        also means retention is off (see ``ServerInfo.dead_letter_retention_enabled``).
        """
        _validate.drain_arguments(queue, max_records)
        if max_records == 0:
            return []
        request = encode_drain_dead_letters_request(queue, max_records)
        attributes = {"sepp.queue": queue or "<all>"}
        with _otel.client_span("sepp.drain_dead_letters", attributes) as span:
            data = await self._rpc("DrainDeadLetters", request)
            records, problems = decode_drain_dead_letters_response(data)
            if span is not None:
                span.set_attribute("sepp.drained", len(records))
        for problem in problems:
            logger.warning("skipping malformed dead-letter record: %s", problem)
        _warn_non_uuid_records(records)
        return records


def _coalescing(option: object) -> bool:
    """``coalesce_enqueues``: ``None`` means the environment's ``SEPP_LITE_COALESCE``
    (off only for ``0``), so a whole program or test suite can turn it off."""
    if option is None:
        return os.environ.get("SEPP_LITE_COALESCE", "1").strip() != "0"
    if not isinstance(option, bool):
        raise ValueError(f"coalesce_enqueues must be a bool or None, got {option!r}")
    return option


_UUID_FORM = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID = re.compile(_UUID_FORM)
# The ids each followed by a newline: all UUIDs exactly when the whole string matches
# and is 37 characters an id long (then its only newlines are the n separators).
_UUID_LINES = re.compile(f"(?:{_UUID_FORM}\n)*")


def _not_uuid(job_id: str) -> str | None:
    """``job_id`` as a warning shows it when it lacks the server's UUID form, else None."""
    if _UUID.fullmatch(job_id):
        return None
    return repr(job_id if len(job_id) <= 64 else job_id[:64] + "...")


def _jobs_with_uuids(jobs: list[Job]) -> list[Job]:
    """The jobs whose id is a UUID. The others are skipped like any malformed job: no
    ack, nack or extend of them could be accepted, and their leases lapse."""
    lines = "\n".join([job.ctx.id for job in jobs]) + "\n"
    if len(lines) == 37 * len(jobs) and _UUID_LINES.fullmatch(lines):
        # The usual answer, in one match: on PyPy a match allocates about 4 KiB of
        # state whatever its length, and a Worker reserves up to 64 jobs at a time.
        return jobs
    kept = []
    for job in jobs:
        shown = _not_uuid(job.ctx.id)
        if shown is None:
            kept.append(job)
        else:
            logger.warning("skipping malformed job in reserve response: id %s is not a UUID", shown)
    return kept


def _warn_non_uuid_records(records: list[DeadLetterRecord]) -> None:
    # Kept all the same: draining deleted them on the server, and no call needs the id.
    for record in records:
        shown = _not_uuid(record.job_id)
        if shown is not None:
            logger.warning("dead-letter record with an id that is not a UUID: %s (kept)", shown)


def _client_tls(
    use_tls: bool, ca_cert: bytes | None, credentials: ssl.SSLContext | None
) -> ssl.SSLContext | None:
    if credentials is not None:
        _validate.ssl_context(credentials, "credentials")
        credentials.set_alpn_protocols(["h2"])  # gRPC servers refuse TLS without ALPN h2
        return credentials
    return tls_context(ca_cert) if use_tls else None


def _encoded_batch(
    batch: list[EnqueueRequest], refused: dict[int, errors.JobRejection]
) -> tuple[list[EnqueueRequest], bytes]:
    """The jobs to send (checked already: see ``_checked_batch``), the refused ones
    left out, and their request. A job too large for any request is refused here."""
    trace = _injected_trace()
    sent, request = _without(batch, refused, trace)
    if len(request) > MAX_MESSAGE_BYTES and _refuse_oversized(batch, refused, trace):
        sent, request = _without(batch, refused, trace)
    return sent, request


def _without(
    batch: list[EnqueueRequest], refused: dict[int, errors.JobRejection], trace: bytes
) -> tuple[list[EnqueueRequest], bytes]:
    sent = [job for index, job in enumerate(batch) if index not in refused] if refused else batch
    return sent, encode_enqueue_batch_request(sent, trace) if sent else b""


def _refuse_oversized(
    batch: list[EnqueueRequest], refused: dict[int, errors.JobRejection], trace: bytes
) -> bool:
    """Refuse, in ``refused``, each job with a payload whose request alone would be over
    the server's message limit, with the ``PayloadTooLarge`` its payload limit gives
    (the server could not even read it: one error for every payload too large, be it
    2 or 20 MB). True when it refused any."""
    found = False
    for index, job in enumerate(batch):
        if index in refused or job.payload is None:
            continue
        alone = len(encode_enqueue_batch_request([job], trace))
        rejection = job_rejection(job, None, size=alone)
        if rejection is not None:
            refused[index] = rejection
            found = True
    return found


def _batch_results(data: bytes, count: int) -> list[EnqueueAck | errors.JobRejection]:
    """The answer of an EnqueueBatch call of ``count`` jobs, checked: one result per job,
    each an ack or a rejection."""
    results = decode_enqueue_batch_response(data)
    if len(results) != count:
        raise errors.BatchResultCountMismatchError(count, len(results))
    if None in results:
        raise errors.MalformedResponseError("a job result in EnqueueBatch sets no outcome")
    return results  # type: ignore[return-value]


def _all_keyed(jobs: list[EnqueueRequest]) -> bool:
    # An empty key counts as none: the server refuses it, so it cannot deduplicate.
    return all(job.idempotency_key for job in jobs)


def _injected_trace() -> bytes:
    """The trace-context field for jobs without one: the current context, which inside
    the client span is the enqueue span itself."""
    if not _otel.AVAILABLE:
        return b""
    headers = _otel.current_headers()
    return b"" if headers is None else trace_context_field(*headers)


def _mark_released(ctx: JobCtx) -> None:
    lease = ctx.lease
    if lease is not None:
        lease.mark_released()


def _worker_id(ctx: JobCtx) -> str | None:
    lease = ctx.lease
    return lease.worker_id if lease is not None else None


def _lease_attributes(ctx: JobCtx, worker_id: str | None) -> dict[str, Any]:
    return {
        "sepp.job_id": ctx.id,
        "sepp.attempt": ctx.attempt,
        "sepp.worker_id": worker_id or "<none>",
    }
