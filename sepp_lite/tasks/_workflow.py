"""Workflows: tasks chained with ``then`` and fanned out with ``map``, handed on from
step to step by the workers themselves, with no coordinator and no result store.

A workflow travels in its jobs. Each job of one carries two custom entries:

- ``sepp.workflow.root``: the workflow's root id, a random hex string the producer
  chose before it enqueued the first step (so it is known before any job id is, and
  stays the same when a dead-lettered first step is requeued as a new job);
- ``sepp.workflow``: compact JSON, ``{"v": 1, "at": 0, "branch": [], "steps": [...]}``:
  the format's version, this job's position in the workflow (0 for the first step),
  the indexes of the elements of each ``map`` on its way here, and the steps still to
  come, each ``{"type": JOB_TYPE, "queue": QUEUE}`` plus ``"map": true`` for a step
  that takes each element of the previous step's sequence, and ``"priority"`` and
  ``"max_attempts"`` when its task sets them.

When a step's handler returns, the tasks worker encodes the value for the next step
and enqueues it, before the step is acked, under the idempotency key
``wf:<root>:<at>`` (``wf:<root>:<at>:<i>.<j>`` on a branch): however often the step
is delivered again, its hand-off deduplicates into the first, within the server's
dedup window. A step whose hand-off fails is nacked, so it runs again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from sepp_lite import _log
from sepp_lite._codec.enqueue import batch_part_size
from sepp_lite._sending import BatchLimits, fit_batches
from sepp_lite.errors import JobRejectedError, SeppError
from sepp_lite.tasks._codecs import Codec
from sepp_lite.types import EnqueueRequest, JobCtx, Payload, Primitive
from sepp_lite.types import RetryDirective as Directive
from sepp_lite.worker import HandlerError

if TYPE_CHECKING:
    from sepp_lite.client import SeppClient

__all__ = [
    "ROOT_KEY",
    "WORKFLOW_KEY",
    "HandOff",
    "Step",
    "Where",
    "hand_off_key",
    "new_root",
    "split",
    "where_of",
]

WORKFLOW_KEY = "sepp.workflow"
ROOT_KEY = _log.WORKFLOW_ROOT_ENTRY  # "sepp.workflow.root"
VERSION = 1
KEY_PREFIX = "wf:"


@dataclass(frozen=True)
class Step:
    """One step still to come in a workflow, as its jobs carry it."""

    job_type: str
    queue: str
    fan: bool = False  # "map": one job per element of the previous step's sequence
    priority: Optional[int] = None
    max_attempts: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"type": self.job_type, "queue": self.queue}
        if self.fan:
            obj["map"] = True
        if self.priority is not None:
            obj["priority"] = self.priority
        if self.max_attempts is not None:
            obj["max_attempts"] = self.max_attempts
        return obj

    @classmethod
    def from_json(cls, obj: Any) -> Step:
        if not isinstance(obj, dict):
            raise ValueError("a step is not an object")
        job_type, queue = obj.get("type"), obj.get("queue")
        if not isinstance(job_type, str) or not isinstance(queue, str):
            raise ValueError("a step has no type or queue")
        priority, attempts = obj.get("priority"), obj.get("max_attempts")
        for value in (priority, attempts):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError("a step's priority or max_attempts is not an int")
        return cls(job_type, queue, obj.get("map") is True, priority, attempts)

    def describe(self) -> str:
        return f"{'map ' if self.fan else ''}{self.job_type} ({self.queue})"


@dataclass(frozen=True)
class Where:
    """Where a job stands in its workflow: what its two custom entries say."""

    root: str
    at: int
    branch: tuple[int, ...]
    steps: tuple[Step, ...]

    def entries(self) -> dict[str, Primitive]:
        body = {
            "v": VERSION,
            "at": self.at,
            "branch": list(self.branch),
            "steps": [step.to_json() for step in self.steps],
        }
        return {ROOT_KEY: self.root, WORKFLOW_KEY: json.dumps(body, separators=(",", ":"))}

    def next(self, index: Optional[int] = None) -> Where:
        """The position of the next step's job (of element ``index`` for a map)."""
        branch = self.branch if index is None else (*self.branch, index)
        return Where(self.root, self.at + 1, branch, self.steps[1:])


def where_of(custom: Mapping[str, Primitive]) -> Optional[Where]:
    """The position a job's custom entries give, None outside any workflow;
    ``ValueError`` for entries this version cannot read."""
    text, root = custom.get(WORKFLOW_KEY), custom.get(ROOT_KEY)
    if text is None:
        return None
    if not isinstance(text, str) or not isinstance(root, str) or not root:
        raise ValueError(f"custom[{WORKFLOW_KEY!r}] or custom[{ROOT_KEY!r}] is not a string")
    try:
        obj = json.loads(text)
    except ValueError:
        raise ValueError(f"custom[{WORKFLOW_KEY!r}] is not JSON") from None
    if not isinstance(obj, dict) or obj.get("v") != VERSION:
        raise ValueError(f"custom[{WORKFLOW_KEY!r}] is not of version {VERSION}")
    at, branch, steps = obj.get("at"), obj.get("branch"), obj.get("steps")
    if not isinstance(at, int) or not isinstance(branch, list) or not isinstance(steps, list):
        raise ValueError(f"custom[{WORKFLOW_KEY!r}] lacks at, branch or steps")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in branch):
        raise ValueError(f"custom[{WORKFLOW_KEY!r}]: branch is not a list of ints")
    return Where(root, at, tuple(branch), tuple(Step.from_json(step) for step in steps))


def hand_off_key(where: Where) -> str:
    """The idempotency key of the job at ``where``: ``wf:<root>:<at>[:<i>.<j>...]``."""
    key = f"{KEY_PREFIX}{where.root}:{where.at}"
    if where.branch:
        key += ":" + ".".join(str(index) for index in where.branch)
    return key


def new_root() -> str:
    """A workflow's root id: random, so that it is known before the first job is."""
    return uuid.uuid4().hex


class HandOff:
    """What a tasks worker does with a step's value: enqueue the next step's job (or
    jobs, for a map) under its hand-off key, before the step is acked."""

    def __init__(self, client: SeppClient, codec_of: Callable[[str, Any], Codec]) -> None:
        self._client = client
        self._codec_of = codec_of

    async def __call__(self, value: Any, ctx: JobCtx) -> None:
        try:
            where = where_of(ctx.custom)
        except ValueError as exc:
            raise HandlerError.permanent(f"workflow: {exc}") from None
        if where is None or not where.steps:
            return  # the last step of its branch
        step = where.steps[0]
        carried = {k: v for k, v in ctx.custom.items() if k not in (ROOT_KEY, WORKFLOW_KEY)}
        if not step.fan:
            request = self._request(step, value, where.next(), carried)
            await self._send([request], step, atomic=False)
            return
        if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
            raise HandlerError.permanent(
                f"workflow: map to {step.job_type} needs a sequence, got {type(value).__name__}"
            )
        requests = [
            self._request(step, element, where.next(index), carried)
            for index, element in enumerate(value)
        ]
        limits = BatchLimits.of(self._client.server_info)
        for part in split(requests, limits.jobs, limits.size):
            await self._send(part, step, atomic=True)

    def _request(
        self, step: Step, value: Any, where: Where, carried: dict[str, Primitive]
    ) -> EnqueueRequest:
        codec = self._codec_of(step.job_type, value)
        try:
            data = codec.encode(value)
        except ValueError as exc:
            raise HandlerError.permanent(
                f"workflow: the value for {step.job_type} does not fit: {exc}"
            ) from None
        return EnqueueRequest(
            queue=step.queue,
            job_type=step.job_type,
            payload=Payload(data, codec.encoding) if data else None,
            idempotency_key=hand_off_key(where),
            priority=step.priority,
            max_attempts=step.max_attempts,
            custom={**carried, **where.entries()},
        )

    async def _send(self, requests: list[EnqueueRequest], step: Step, atomic: bool) -> None:
        try:
            if atomic:
                await self._client.enqueue_atomic(requests)
            else:
                await self._client.enqueue(requests[0])
        except (SeppError, TypeError, ValueError) as exc:
            permanent = isinstance(exc, (TypeError, ValueError))
            if isinstance(exc, JobRejectedError):
                what = str(exc)
            else:
                what = f"{type(exc).__name__}: {exc}"
            reason = f"workflow: hand-off to {step.job_type} failed ({what})"
            directive = Directive.DEAD_LETTER if permanent else Directive.DEFAULT
            raise HandlerError(reason, directive) from exc


def split(
    requests: list[EnqueueRequest], max_jobs: int, max_bytes: int
) -> list[list[EnqueueRequest]]:
    """``requests`` in order, cut into calls of at most ``max_jobs`` jobs and
    ``max_bytes`` each (``_sending.fit_batches``, each job measured as the client sends
    it); a job over ``max_bytes`` goes alone. The same requests and limits give the same
    calls (each job keeps its key whatever the cut)."""
    return fit_batches(requests, BatchLimits(max_jobs, max_bytes), batch_part_size)
