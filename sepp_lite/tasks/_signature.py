"""What a task's function takes, read once when it is registered.

A worker calls a task's function with its input and, if it has a second parameter,
the job's :class:`~sepp_lite.JobCtx` (a periodic task: the JobCtx or nothing). A
function shaped otherwise would run with the wrong argument (a celery-style
``add(x, y)`` would get the JobCtx as ``y``), so every other shape is a ``TypeError``
here, naming the function and the parameter. Annotations are resolved one parameter
at a time in the function's own module, so one that cannot be (``JobCtx`` imported
only under ``TYPE_CHECKING``) spoils only itself. Functions, methods,
``functools.partial`` objects and callable objects are read alike.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from typing import Any, Callable, NamedTuple, Optional

from sepp_lite.tasks._convert import is_union, type_name, unwrap
from sepp_lite.types import JobCtx

__all__ = ["Shape", "check_task_function", "is_async", "job_type_of", "name_of", "shape_of"]

Parameter = inspect.Parameter

_SEVERAL = (
    ". To carry several values, make them the fields of one dataclass and take that as the input"
)


class _Rules(NamedTuple):
    inputs: int  # positional parameters before the JobCtx's
    takes: str  # what such a function takes, for messages
    ctx_role: str  # the parameter that receives the JobCtx, for messages
    extra: str  # the first parameter too many, for messages
    advice: str  # how to carry several values (a task) or nothing (periodic)


_TASK = _Rules(
    1, "a task takes one input and, optionally, the JobCtx", "a task's second", "third", _SEVERAL
)
_PERIODIC = _Rules(
    0, "a periodic task takes the JobCtx or nothing", "a periodic task's", "second", ""
)


class Shape(NamedTuple):
    """A task function's input parameter (empty for a periodic task), the input's
    annotation (None when not asked for), and whether it takes the JobCtx."""

    param: str
    annotation: Any
    takes_ctx: bool


def check_task_function(fn: object) -> None:
    """``TypeError`` unless ``fn`` can be a task's function: an ``async def`` (run on
    the event loop) or a plain ``def`` (run in one of the worker's threads)."""
    name = name_of(fn)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(f"{name!r}: a task is an async def or a plain def, not a generator")
    if inspect.isclass(fn) or not callable(fn):
        raise TypeError(f"{name!r}: a task is an async def or a plain def function")


def shape_of(fn: Callable[..., Any], *, periodic: bool = False, hinted: bool = True) -> Shape:
    """What ``fn`` takes: one input (with its resolved annotation when ``hinted``) and
    optionally the JobCtx, or for a ``periodic`` task the JobCtx or nothing.
    ``TypeError`` naming the parameter for any other shape."""
    check_task_function(fn)
    rules = _PERIODIC if periodic else _TASK
    positional = _positional(fn, rules)
    namespace = _namespace(fn)
    if len(positional) > rules.inputs:
        _check_ctx(fn, positional[rules.inputs], namespace, rules)
    takes_ctx = len(positional) > rules.inputs
    if periodic:
        return Shape("", None, takes_ctx)
    param = positional[0]
    if not hinted:
        return Shape(param.name, None, takes_ctx)
    if param.annotation is Parameter.empty:
        raise TypeError(f"{name_of(fn)}: annotate the input {param.name!r} with its type")
    try:
        annotation = _resolved(param.annotation, namespace)
    except Exception as exc:  # NameError, SyntaxError, TypeError alike
        raise TypeError(
            f"{name_of(fn)}: cannot resolve the annotation of parameter {param.name!r} "
            f"({exc}); define what it names at module level, or pass input_type="
        ) from None
    return Shape(param.name, annotation, takes_ctx)


def _positional(fn: Callable[..., Any], rules: _Rules) -> list[Parameter]:
    """The parameters a call fills, in order; ``TypeError`` for one it cannot fill or
    one too many."""
    try:
        params = inspect.signature(fn).parameters.values()
    except ValueError as exc:  # a builtin without a signature
        raise TypeError(f"{name_of(fn)}: cannot read its parameters ({exc})") from None
    positional = []
    for param in params:
        if param.kind in (Parameter.VAR_POSITIONAL, Parameter.VAR_KEYWORD):
            raise _refused(fn, param, "would receive nothing", rules)
        if param.kind is Parameter.KEYWORD_ONLY:
            if param.default is Parameter.empty:
                raise _refused(fn, param, "is a keyword-only parameter without a default", rules)
        else:
            positional.append(param)
    if len(positional) > rules.inputs + 1:
        raise _refused(fn, positional[rules.inputs + 1], f"is a {rules.extra} parameter", rules)
    if len(positional) < rules.inputs:
        raise TypeError(
            f"{name_of(fn)}: a task takes its input as its first parameter (and, "
            "optionally, the JobCtx as its second); it takes none. For a job without "
            "data, take an input annotated None; to run on a schedule, use @tasks.periodic"
        )
    return positional


def _check_ctx(
    fn: Callable[..., Any], param: Parameter, namespace: dict[str, Any], rules: _Rules
) -> None:
    """``TypeError`` unless ``param`` can receive the JobCtx: not annotated, or
    annotated with a type a JobCtx is (``JobCtx``, ``Optional[JobCtx]``, ``Any``...)."""
    annotation = param.annotation
    if annotation is Parameter.empty:
        return
    try:
        resolved = _resolved(annotation, namespace)
    except Exception as exc:  # NameError, SyntaxError, TypeError alike
        if isinstance(annotation, str) and _names_jobctx(annotation):
            return  # JobCtx imported only for type checkers: it says what it is
        raise TypeError(
            f"{name_of(fn)}: cannot resolve the annotation of parameter {param.name!r} "
            f"({exc}); {rules.ctx_role} parameter receives the JobCtx: annotate it "
            "JobCtx, or leave it unannotated"
        ) from None
    if not _receives_jobctx(resolved):
        why = (
            f"is annotated {type_name(resolved)}, but {rules.ctx_role} parameter receives "
            "the JobCtx (annotate it JobCtx, or leave it unannotated)"
        )
        raise _refused(fn, param, why, rules)


def _refused(fn: Callable[..., Any], param: Parameter, why: str, rules: _Rules) -> TypeError:
    stars: dict[Any, str] = {Parameter.VAR_POSITIONAL: "*", Parameter.VAR_KEYWORD: "**"}
    shown = stars.get(param.kind, "") + param.name
    return TypeError(f"{name_of(fn)}: parameter {shown!r} {why}: {rules.takes}{rules.advice}")


def _receives_jobctx(tp: Any) -> bool:
    tp = unwrap(tp)
    if tp is Any:
        return True
    if is_union(typing.get_origin(tp)):
        return any(_receives_jobctx(arm) for arm in typing.get_args(tp))
    try:
        return isinstance(tp, type) and issubclass(JobCtx, tp)
    except TypeError:  # a Protocol that issubclass cannot check
        return False


# "JobCtx", "sepp.JobCtx", "Optional[JobCtx]", "JobCtx | None"
_JOBCTX = re.compile(r"((typing\.)?Optional\[)?(\w+\.)*JobCtx\]?(\|None)?|None\|(\w+\.)*JobCtx")


def _names_jobctx(text: str) -> bool:
    return _JOBCTX.fullmatch(text.replace(" ", "")) is not None


def _resolved(annotation: Any, namespace: dict[str, Any]) -> Any:
    """``annotation`` evaluated as ``typing.get_type_hints`` does, on its own."""
    holder = types.SimpleNamespace(__annotations__={"p": annotation})
    return typing.get_type_hints(holder, globalns=namespace, include_extras=True)["p"]


def _namespace(fn: Any) -> dict[str, Any]:
    """The globals of the module ``fn``'s annotations were written in."""
    if isinstance(fn, functools.partial):
        return _namespace(fn.func)
    if inspect.ismethod(fn):
        return _namespace(fn.__func__)
    if inspect.isfunction(fn):
        found: dict[str, Any] = inspect.unwrap(fn).__globals__
        return found
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method, not callable()
    return _namespace(call) if inspect.isfunction(call) else {}


def name_of(fn: object) -> str:
    """How a task's function is named in messages: its qualified name, that of the
    function a ``partial`` wraps, or ``Class.__call__`` for a callable object."""
    if isinstance(fn, functools.partial):
        return name_of(fn.func)
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        return name
    if callable(fn):
        return f"{type(fn).__qualname__}.__call__"
    return repr(fn)


def job_type_of(fn: object, job_type: Optional[str]) -> str:
    """``job_type``, or else the function's name; ``TypeError`` when it has none (a
    ``partial``, a callable object)."""
    if job_type is not None:
        return job_type
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"{name_of(fn)} has no __name__: give job_type= to name its jobs")
    return name


def is_async(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine: an ``async def``, a method or a
    ``partial`` of one, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method, not callable()
    )
