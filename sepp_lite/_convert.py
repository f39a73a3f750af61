"""GetServerInfo conversions (kept under this name for the modules that import it; the
work is done by the codec)."""

from __future__ import annotations

from sepp_lite._codec.client import decode_server_info
from sepp_lite._codec.server import encode_server_info

__all__ = ["decode_server_info", "encode_server_info"]
