"""``python -m sepp_lite.testing``: see :mod:`sepp_lite.testing._cli`."""

from __future__ import annotations

from sepp_lite.testing._cli import main

raise SystemExit(main())
