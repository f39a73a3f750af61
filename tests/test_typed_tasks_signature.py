"""What a task's function may take, checked when it is registered: its one input and,
optionally, a second parameter that receives the JobCtx; a periodic task the JobCtx or
nothing. Anything else (a celery-style second input, a third parameter, keyword-only
parameters the worker cannot fill, ``*args``/``**kwargs``) is a TypeError at
decoration naming the function and the parameter, never a job whose second input
silently receives the JobCtx. Methods, ``functools.partial`` objects and callable
objects are tasks too, and receive what a function does."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional

import pytest

import sepp_lite as sepp
from sepp_lite import JobCtx
from sepp_lite.tasks import Tasks
from sepp_lite.testing import SeppTestServer, run_until_drained
from tests.client_helpers import unique_queue

pytestmark = pytest.mark.timeout(60)


@dataclass
class Welcome:
    to: str


def defined(source: str, name: str, **namespace: Any) -> Callable[..., Any]:
    """A function defined in a module of its own, with string annotations (as under
    ``from __future__ import annotations``) and only ``namespace`` for globals: the
    way a module that imports JobCtx only under TYPE_CHECKING leaves it."""
    module: dict[str, Any] = {"__name__": "tasks_module", **namespace}
    exec("from __future__ import annotations\n" + source, module)
    fn: Callable[..., Any] = module[name]
    return fn


# -- tasks: what is refused, and what the message says ---------------------------------


async def add(x: int, y: int) -> None: ...


async def add_default(x: int, y: int = 0) -> None: ...


async def one_too_many(msg: Welcome, ctx: JobCtx, extra: int = 0) -> None: ...


async def keyword_only(msg: Welcome, *, retries: int) -> None: ...


async def star_args(msg: Welcome, *more: Welcome) -> None: ...


async def star_kwargs(msg: Welcome, **more: Welcome) -> None: ...


async def no_input() -> None: ...


# How Python writes it: Optional[int] up to 3.13, int | None from 3.14 on (typing.Union
# and | became one type).
OPTIONAL_INT = str(Optional[int]).replace("typing.", "")


async def optional_int(msg: Welcome, ctx: Optional[int] = None) -> None: ...


def blocking_add(x: int, y: str) -> None: ...


SECOND = "but a task's second parameter receives the JobCtx"
REFUSED = [
    (add, "y", f"is annotated int, {SECOND}"),
    (add_default, "y", f"is annotated int, {SECOND}"),
    (blocking_add, "y", f"is annotated str, {SECOND}"),
    (optional_int, "ctx", f"is annotated {OPTIONAL_INT}, {SECOND}"),
    (one_too_many, "extra", "is a third parameter"),
    (keyword_only, "retries", "is a keyword-only parameter without a default"),
    (star_args, "*more", "would receive nothing"),
    (star_kwargs, "**more", "would receive nothing"),
]


@pytest.mark.parametrize(("fn", "param", "why"), REFUSED, ids=[r[0].__name__ for r in REFUSED])
def test_a_task_takes_one_input_and_optionally_the_ctx(
    fn: Callable[..., Any], param: str, why: str
) -> None:
    tasks = Tasks(queue="q")
    for register in (tasks.task, tasks.task(max_attempts=3), tasks.task(input_type=int)):
        with pytest.raises(TypeError) as caught:
            register(fn)
        message = str(caught.value)
        assert message.startswith(f"{fn.__qualname__}: parameter {param!r}"), message
        assert why in message, message
        assert "a task takes one input and, optionally, the JobCtx" in message, message
        assert "one dataclass" in message, message  # how to carry several values
    assert len(tasks) == 0


def test_a_task_without_a_parameter_is_told_what_it_takes() -> None:
    with pytest.raises(TypeError) as caught:
        Tasks(queue="q").task(no_input)  # type: ignore[call-overload]
    assert str(caught.value) == (
        "no_input: a task takes its input as its first parameter (and, optionally, the "
        "JobCtx as its second); it takes none. For a job without data, take an input "
        "annotated None; to run on a schedule, use @tasks.periodic"
    )


def test_annotations_that_are_not_strings_are_checked_the_same() -> None:
    async def add_real(x: int, y: int) -> None: ...

    add_real.__annotations__ = {"x": int, "y": int, "return": None}
    with pytest.raises(TypeError, match=r"add_real: parameter 'y' is annotated int"):
        Tasks(queue="q").task(add_real)


def test_a_ctx_annotation_that_cannot_be_resolved_is_named() -> None:
    unknown = defined("async def f(x: int, ctx: Context) -> None: ...", "f")
    with pytest.raises(TypeError) as caught:
        Tasks(queue="q").task(unknown)
    assert str(caught.value).startswith(
        "f: cannot resolve the annotation of parameter 'ctx' (name 'Context' is not defined)"
    )
    # The input's own annotation, unresolved, can be given instead.
    no_input_type = defined("async def g(order: Order) -> None: ...", "g")
    with pytest.raises(TypeError, match=r"^g: cannot resolve the annotation of parameter "):
        Tasks(queue="q").task(no_input_type)
    assert Tasks(queue="q").task(input_type=int)(no_input_type).input_type is int


# -- tasks: what is accepted -----------------------------------------------------------


async def ctx_typed(msg: Welcome, ctx: JobCtx) -> None: ...


async def ctx_bare(msg: Welcome, ctx) -> None:  # type: ignore[no-untyped-def]
    ...


async def ctx_optional(msg: Welcome, ctx: Optional[JobCtx] = None) -> None: ...


async def ctx_union(msg: Welcome, ctx: JobCtx | None = None) -> None: ...


async def ctx_any(msg: Welcome, ctx: Any) -> None: ...


async def ctx_object(msg: Welcome, ctx: object) -> None: ...


async def ctx_annotated(msg: Welcome, ctx: Annotated[JobCtx, "the job"]) -> None: ...


async def ctx_dotted(msg: Welcome, ctx: sepp.JobCtx) -> None: ...


async def with_options(msg: Welcome, ctx: JobCtx, *, dry_run: bool = False) -> None: ...


async def input_only(msg: Welcome) -> None: ...


ACCEPTED = [
    ctx_typed,
    ctx_bare,
    ctx_optional,
    ctx_union,
    ctx_any,
    ctx_object,
    ctx_annotated,
    ctx_dotted,
    with_options,
    input_only,
    # JobCtx imported only under TYPE_CHECKING: the annotation names it, unresolved.
    defined("async def hidden(msg: Welcome, ctx: JobCtx) -> None: ...", "hidden", Welcome=Welcome),
    defined(
        "async def hidden_dotted(msg: Welcome, ctx: Optional[sepp.JobCtx]) -> None: ...",
        "hidden_dotted",
        Welcome=Welcome,
        Optional=Optional,
    ),
]


@pytest.mark.parametrize("fn", ACCEPTED, ids=[fn.__name__ for fn in ACCEPTED])
async def test_the_ctx_may_be_annotated_as_anything_a_jobctx_is(fn: Callable[..., Any]) -> None:
    task = Tasks(queue="q").task(fn)
    assert task.input_type is Welcome
    await task(Welcome("a"), None)  # with the ctx only if the function takes it


# -- methods, partials and callable objects ----------------------------------------------


class Mailer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    async def send(self, msg: Welcome, ctx: JobCtx) -> None:
        self.sent.append(("method", msg.to, type(ctx)))

    async def __call__(self, msg: Welcome, ctx: JobCtx) -> None:
        self.sent.append(("object", msg.to, type(ctx)))


async def send_with(mailer: Mailer, msg: Welcome, ctx: JobCtx) -> None:
    mailer.sent.append(("partial", msg.to, type(ctx)))


def send_blocking(mailer: Mailer, msg: Welcome) -> None:
    mailer.sent.append(("blocking partial", msg.to, None))


class BadCall:
    async def __call__(self, x: int, y: int) -> None: ...


def test_a_partial_or_an_object_needs_a_job_type_and_is_checked_too() -> None:
    tasks = Tasks(queue="q")
    mailer = Mailer()
    with pytest.raises(TypeError, match=r"has no __name__: give job_type="):
        tasks.task(functools.partial(send_with, mailer))
    with pytest.raises(TypeError, match=r"has no __name__: give job_type="):
        tasks.task(mailer)
    with pytest.raises(TypeError, match=r"BadCall\.__call__: parameter 'y' is annotated int"):
        tasks.task(job_type="bad")(BadCall())

    async def unrelated(mailer: Mailer, x: int, y: int) -> None: ...

    with pytest.raises(TypeError, match=r"unrelated: parameter 'y' is annotated int"):
        tasks.task(job_type="p")(functools.partial(unrelated, mailer))
    assert len(tasks) == 0


async def test_methods_partials_and_callable_objects_run_as_tasks(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    tasks = Tasks(queue=unique_queue())
    mailer = Mailer()
    method = tasks.task(mailer.send)
    partial = tasks.task(job_type="partial")(functools.partial(send_with, mailer))
    blocking = tasks.task(job_type="blocking")(functools.partial(send_blocking, mailer))
    obj = tasks.task(job_type="object")(mailer)
    assert [t.input_type for t in (method, partial, blocking, obj)] == [Welcome] * 4
    assert [t.threaded for t in (method, partial, blocking, obj)] == [False, False, True, False]
    for task in (method, partial, blocking, obj):
        await task.enqueue(client, Welcome(task.job_type))
    await run_until_drained(tasks.worker(client), server)
    assert sorted(mailer.sent, key=repr) == sorted(
        [
            ("method", "send", JobCtx),
            ("partial", "partial", JobCtx),
            ("blocking partial", "blocking", None),
            ("object", "object", JobCtx),
        ],
        key=repr,
    )


# -- the ctx arrives where the function asked for it -------------------------------------


async def test_every_accepted_ctx_parameter_receives_the_jobctx(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    tasks = Tasks(queue=unique_queue())
    seen: dict[str, Any] = {}

    @tasks.task
    async def optional(msg: Welcome, ctx: Optional[JobCtx] = None) -> None:
        seen["optional"] = ctx

    @tasks.task
    async def keyword(msg: Welcome, ctx: JobCtx, *, dry_run: bool = False) -> None:
        seen["keyword"] = (ctx, dry_run)

    await optional.enqueue(client, Welcome("a"))
    await keyword.enqueue(client, Welcome("b"))
    await run_until_drained(tasks.worker(client), server)
    assert isinstance(seen["optional"], JobCtx)
    assert isinstance(seen["keyword"][0], JobCtx) and seen["keyword"][1] is False


# -- periodic tasks ------------------------------------------------------------------------


async def tick(when: int) -> None: ...


async def tick_two(ctx: JobCtx, extra: int) -> None: ...


async def tick_keyword(*, ctx: JobCtx) -> None: ...


async def tick_args(*slots: JobCtx) -> None: ...


PERIODIC_REFUSED = [
    (tick, "when", "is annotated int, but a periodic task's parameter receives the JobCtx"),
    (tick_two, "extra", "is a second parameter"),
    (tick_keyword, "ctx", "is a keyword-only parameter without a default"),
    (tick_args, "*slots", "would receive nothing"),
]


@pytest.mark.parametrize(
    ("fn", "param", "why"), PERIODIC_REFUSED, ids=[r[0].__name__ for r in PERIODIC_REFUSED]
)
def test_a_periodic_task_takes_the_ctx_or_nothing(
    fn: Callable[..., Any], param: str, why: str
) -> None:
    tasks = Tasks(queue="q")
    with pytest.raises(TypeError) as caught:
        tasks.periodic(every=60)(fn)
    message = str(caught.value)
    assert message.startswith(f"{fn.__qualname__}: parameter {param!r}"), message
    assert why in message, message
    assert message.endswith("a periodic task takes the JobCtx or nothing"), message
    assert len(tasks) == 0 and tasks.periodic_jobs == []


async def tick_optional(ctx: Optional[JobCtx] = None) -> None: ...


async def tick_bare(ctx) -> None:  # type: ignore[no-untyped-def]
    ...


async def tick_nothing() -> None: ...


def test_a_periodic_task_may_take_the_ctx_as_a_jobctx_can_be_annotated() -> None:
    tasks = Tasks(queue="q")
    hidden = defined("async def hidden_tick(ctx: JobCtx) -> None: ...", "hidden_tick")
    for fn in (tick_optional, tick_bare, tick_nothing, hidden):
        tasks.periodic(every=60)(fn)
    assert tasks.job_types == ["tick_optional", "tick_bare", "tick_nothing", "hidden_tick"]
