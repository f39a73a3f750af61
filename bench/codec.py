"""Codec speed: sepp_lite's hand-written codec against betterproto 2.0.0b7, same run.

Bars (issue 2): encoding one EnqueueRequest (256-byte payload, idempotency key,
priority, two custom entries) <= 5 us on CPython 3.11 and <= 1.5 us on PyPy; decoding
a 100-job ReserveResponse <= 15 us per job on CPython and <= 3 us on PyPy, domain
value objects included. Run: ``python bench/codec.py [--json FILE]``.

Wall-clock figures on a shared machine are noisy. ``--ops N --row encode|decode`` runs
one sepp_lite row N times without timing, for an instruction count that does not depend
on the load: ``valgrind --tool=callgrind python bench/codec.py --ops N --row ROW`` with
``PYTHONHASHSEED=0``, for N = 0 and N > 0; the difference over N is the cost of one
encode, or of one 100-job decode.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import interpreter, per_op_us

from sepp_lite._codec.enqueue import write_enqueue_request
from sepp_lite._codec.job import decode_reserve_response
from sepp_lite._proto.sepp import v1 as pb
from sepp_lite.types import EnqueueRequest, Payload

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BARS = {"CPython": (5.0, 15.0), "PyPy": (1.5, 3.0)}


def enqueue_request() -> EnqueueRequest:
    return EnqueueRequest(
        "emails",
        "send_welcome",
        payload=Payload(bytes(range(256)), "application/json"),
        idempotency_key=f"user-{uuid.uuid4()}",
        priority=5,
        custom={"tenant": "acme", "retries": 3},
    )


def reserve_response(count: int = 100) -> bytes:
    now = datetime.now(timezone.utc).replace(microsecond=123000)
    jobs = [
        pb.Job(
            id=str(uuid.uuid4()),
            job_type="send_welcome",
            payload=pb.Payload(bytes(range(256)), "application/json"),
            priority=5,
            trace_context=pb.TraceContext(traceparent=TRACEPARENT),
            enqueued_at=now,
            attempt=1,
            max_attempts=3,
            lease_expires_at=now + timedelta(seconds=30),
            custom={
                "tenant": pb.PrimitiveValue(string_value="acme"),
                "retries": pb.PrimitiveValue(int_value=3),
                "vip": pb.PrimitiveValue(bool_value=True),
            },
            queue="emails",
        )
        for _ in range(count)
    ]
    return bytes(pb.ReserveResponse(jobs=jobs))


def betterproto_request(req: EnqueueRequest) -> pb.EnqueueRequest:
    assert req.payload is not None
    return pb.EnqueueRequest(
        queue=req.queue,
        job_type=req.job_type,
        payload=pb.Payload(req.payload.data, req.payload.encoding),
        idempotency_key=req.idempotency_key,
        priority=int(req.priority or 0),
        custom={
            "tenant": pb.PrimitiveValue(string_value="acme"),
            "retries": pb.PrimitiveValue(int_value=3),
        },
    )


def measure() -> dict[str, float]:
    req = enqueue_request()
    data = reserve_response()
    assert write_enqueue_request(req) == bytes(betterproto_request(req))
    jobs, problems = decode_reserve_response(data)
    assert len(jobs) == 100 and not problems
    return {
        "encode_enqueue_us": per_op_us(lambda: write_enqueue_request(req), 1),
        "decode_job_us": per_op_us(lambda: decode_reserve_response(data), 100),
        # betterproto: building the message object is part of its encode cost.
        "betterproto_encode_enqueue_us": per_op_us(
            lambda: bytes(betterproto_request(req)), 1, rounds=3
        ),
        "betterproto_decode_job_us": per_op_us(
            lambda: pb.ReserveResponse().parse(data).jobs[0].id, 100, rounds=3
        ),
    }


def run_fixed(row: str, ops: int) -> None:
    """``ops`` operations of one row, untimed (after one of each, so that N = 0 pays
    for the same imports, data and caches as N > 0)."""
    req = enqueue_request()
    data = reserve_response()
    operation = {
        "encode": lambda: write_enqueue_request(req),
        "decode": lambda: decode_reserve_response(data),
    }[row]
    operation()
    for _ in range(ops):
        operation()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--ops", type=int, help="run one row this many times, untimed")
    parser.add_argument("--row", choices=["encode", "decode"], default="encode")
    args = parser.parse_args()
    if args.ops is not None:
        run_fixed(args.row, args.ops)
        return 0
    figures = measure()
    encode_bar, decode_bar = BARS.get(platform.python_implementation(), BARS["CPython"])
    print(f"codec benchmark on {interpreter()} (median of rounds, microseconds)")
    print(f"{'':34}{'sepp_lite':>12}{'betterproto':>14}{'bar':>8}")
    print(
        f"{'encode EnqueueRequest':34}{figures['encode_enqueue_us']:12.2f}"
        f"{figures['betterproto_encode_enqueue_us']:14.1f}{encode_bar:8.1f}"
    )
    print(
        f"{'decode ReserveResponse, per job':34}{figures['decode_job_us']:12.2f}"
        f"{figures['betterproto_decode_job_us']:14.1f}{decode_bar:8.1f}"
    )
    ok = figures["encode_enqueue_us"] <= encode_bar and figures["decode_job_us"] <= decode_bar
    print("within the bars" if ok else "OVER A BAR")
    if args.json:
        args.json.write_text(json.dumps({"interpreter": interpreter(), **figures}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
