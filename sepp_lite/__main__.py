"""``python -m sepp_lite``: the ``sepp-lite`` command (see :mod:`sepp_lite.cli`)."""

from __future__ import annotations

from sepp_lite.cli import main

raise SystemExit(main())
