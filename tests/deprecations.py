"""sepp_lite's own DeprecationWarnings are errors, whatever the other filters say.

A warnings filter's module pattern matches the module the warning is attributed to
(its ``stacklevel``), so ``error::DeprecationWarning:sepp_lite`` misses a deprecated
standard-library call whose warning names the library's own module, or a frame deeper
than sepp_lite's. This filter's module slot is an object whose ``match()`` (which the
warnings machinery calls with the module's name) looks at the stack instead: the
warning is sepp_lite's when it is attributed to a sepp_lite module, or when the frames
from the one that warned outwards are the standard library's up to one in sepp_lite/.
tests/conftest.py puts it first in the filters for each test's setup, call and teardown.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import sepp_lite

SEPP_LITE = os.path.dirname(sepp_lite.__file__) + os.sep
STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep


def from_sepp_lite(module: str, frame: object) -> bool:
    """Whether a warning attributed to ``module``, its innermost Python frame
    ``frame``, comes from sepp_lite's code."""
    if module == "sepp_lite" or module.startswith("sepp_lite."):
        return True
    while frame is not None:
        filename = frame.f_code.co_filename  # type: ignore[attr-defined]
        if filename.startswith(SEPP_LITE):
            return True
        if not (
            os.path.realpath(filename).startswith(STDLIB)
            or filename.startswith("<frozen ")
            or filename == __file__
        ):
            return False
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


class _SeppLiteOrigin:
    """The module slot of the filter (the warnings machinery calls its ``match``)."""

    def match(self, module: str) -> bool:
        return from_sepp_lite(module, sys._getframe(1))


@contextmanager
def sepp_lite_deprecations_are_errors() -> Iterator[None]:
    """The filter first, for as long as this lasts (the caller's catch_warnings, or
    pytest's, restores the filters afterwards: this removes only its own entry)."""
    warnings.filterwarnings("error", category=DeprecationWarning, module="sepp_lite")
    entry = (*warnings.filters[0][:3], _SeppLiteOrigin(), 0)
    warnings.filters[0] = entry  # type: ignore[index]
    try:
        yield
    finally:
        if entry in warnings.filters:
            warnings.filters.remove(entry)  # type: ignore[arg-type]
