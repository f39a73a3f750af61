"""An example worker module, as the Dockerfile beside it packages it: put yours here.

``sepp-lite worker tasks:make_worker`` calls ``make_worker`` with a client connected
from ``SEPP_ADDR`` and ``SEPP_API_KEY``.
"""

import json
import logging
import os
from typing import Optional

import sepp_lite as sepp

QUEUES = os.environ.get("WORKER_QUEUES", "emails").split(",")
# The longest a graceful stop takes: Kubernetes' terminationGracePeriodSeconds and
# systemd's TimeoutStopSec (deploy/) are set above it.
SHUTDOWN_TIMEOUT = 60
# Jobs one worker process handles at once; times --processes, a pod's capacity, which
# the KEDA ScaledObjects of deploy/kubernetes/ divide the queue's jobs by.
MAX_IN_FLIGHT = 16

log = logging.getLogger("tasks")


def make_worker(client: sepp.SeppClient) -> sepp.Worker:
    worker = sepp.Worker(
        client,
        QUEUES,
        lease_duration=60,
        max_in_flight=MAX_IN_FLIGHT,
        auto_extend=True,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )

    @worker.handler("send_welcome")
    async def send_welcome(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        to = json.loads(payload.data)["to"] if payload is not None else "nobody"
        log.info("welcoming %s (job %s)", to, ctx.id)

    return worker
