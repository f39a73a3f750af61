"""pytest plugin: make ``import sepp`` give sepp_lite, so the official client's own
integration tests exercise sepp_lite's API unchanged.

Used as ``PYTHONPATH=tests/official pytest -p alias_sepp ...`` (see run.sh)."""

from __future__ import annotations

import sys

import sepp_lite

sys.modules["sepp"] = sepp_lite
