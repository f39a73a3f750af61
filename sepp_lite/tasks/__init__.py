"""Typed tasks: functions with one typed input that producers enqueue by reference and
a Worker runs, on top of the public SeppClient and Worker.

    tasks = Tasks(queue="emails")

    @tasks.task(max_attempts=5, timeout=30)
    async def send_welcome(msg: Welcome, ctx: JobCtx) -> None: ...

    await send_welcome.enqueue(client, Welcome(to="ada@example.com"))
    await tasks.worker(client).run()

The input travels as an ordinary payload (JSON for dataclasses and the like, UTF-8 for
``str``, raw ``bytes``), so producers and workers in other languages, and sepp-py's,
interoperate. The documentation's "Typed tasks" page
(docs/tasks.md) is the guide.
"""

from __future__ import annotations

from sepp_lite.tasks._codecs import BytesCodec, Codec, CodecFactory, JsonCodec, TextCodec
from sepp_lite.tasks._convert import InputError
from sepp_lite.tasks._registry import State, Tasks, TaskWorker
from sepp_lite.tasks._task import Backoff, Chain, Middleware, Retry, Task

__all__ = [
    "Backoff",
    "BytesCodec",
    "Chain",
    "Codec",
    "CodecFactory",
    "InputError",
    "JsonCodec",
    "Middleware",
    "Retry",
    "State",
    "Task",
    "TaskWorker",
    "Tasks",
    "TextCodec",
]
