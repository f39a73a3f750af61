"""tests/deprecations.py: a DeprecationWarning that sepp_lite's code sets off is an
error even where another filter ignores DeprecationWarnings; one that other code sets
off is not. The code here is compiled under file names in sepp_lite/, the standard
library and elsewhere, so the stack looks as it would."""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import pytest

from tests.deprecations import SEPP_LITE, STDLIB, sepp_lite_deprecations_are_errors


def function(filename: str, module: str, source: str, **names: Any) -> Callable[[], None]:
    """``def f(): source``, compiled as if it were in ``filename``, module ``module``."""
    namespace: dict[str, Any] = {"__name__": module, "warnings": warnings, **names}
    body = "def f():\n    " + source + "\n"
    exec(compile(body, filename, "exec"), namespace)
    return namespace["f"]  # type: ignore[no-any-return]


# A deprecated standard-library API: it warns about its caller (stacklevel=2), or about
# itself (stacklevel=1: a frame deeper than the caller).
def deprecated_api(stacklevel: int) -> Callable[[], None]:
    return function(
        os.path.join(STDLIB, "asyncio", "events_fake.py"),
        "asyncio.events_fake",
        f"warnings.warn('old API', DeprecationWarning, stacklevel={stacklevel})",
    )


def caller(directory: str, module: str, api: Callable[[], None]) -> Callable[[], None]:
    return function(os.path.join(directory, "fake.py"), module, "api()", api=api)


def run_ignoring_deprecations(code: Callable[[], None]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with sepp_lite_deprecations_are_errors():
            code()


@pytest.mark.parametrize("stacklevel", [1, 2])
def test_sepp_lite_calling_a_deprecated_api_is_an_error(stacklevel):
    code = caller(SEPP_LITE, "sepp_lite.fake", deprecated_api(stacklevel))
    with pytest.raises(DeprecationWarning, match="old API"):
        run_ignoring_deprecations(code)


def test_a_warning_sepp_lite_raises_itself_is_an_error():
    code = function(
        os.path.join(SEPP_LITE, "fake.py"),
        "sepp_lite.fake",
        "warnings.warn('our own', DeprecationWarning)",
    )
    with pytest.raises(DeprecationWarning, match="our own"):
        run_ignoring_deprecations(code)


@pytest.mark.parametrize("stacklevel", [1, 2])
def test_other_code_calling_a_deprecated_api_is_left_to_the_other_filters(tmp_path, stacklevel):
    code = caller(str(tmp_path), "elsewhere", deprecated_api(stacklevel))
    run_ignoring_deprecations(code)  # no error


def test_other_categories_are_left_to_the_other_filters():
    code = function(
        os.path.join(SEPP_LITE, "fake.py"),
        "sepp_lite.fake",
        "warnings.warn('just saying', UserWarning)",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sepp_lite_deprecations_are_errors():
            code()


def test_the_filter_is_gone_afterwards():
    before = list(warnings.filters)
    with sepp_lite_deprecations_are_errors():
        assert len(warnings.filters) == len(before) + 1
    assert warnings.filters == before
