"""The node's settings, as `dcptool node start` takes them."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dcptool.errors import UsageError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, *, what: str = "size") -> int:
    """'64MiB', '64m', '65536' -> bytes (binary units)."""
    m = _SIZE.match(text or "")
    if not m:
        raise UsageError(f"{what} {text!r} is not a size such as 65536, 512KiB or 64MiB")
    unit = (m.group(2) or "").lower().rstrip("b").rstrip("i")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass
class NodeConfig:
    """Everything a node needs to start.

    * `checkpoint_memory`: the budget of in-memory checkpoints; above it the slowest DCP
      cursor is dropped and its stream continues from disk.
    * `flush_interval`: seconds between flusher batches (each batch is one disk snapshot).
    * `expiry_pager_interval`: seconds between runs of the expiry pager.
    * `max_backfills`: disk backfills that may hold a read transaction at once.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 11210
    vbuckets: int = 1024
    bucket: str = "default"
    checkpoint_memory: int = 256 * 1024 * 1024
    checkpoint_max_items: int = 10000
    flush_interval: float = 0.02
    expiry_pager_interval: float = 10.0
    max_backfills: int = 8
    max_connections: int = 4096

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port {self.port} is not a TCP port (0..65535)")
        if not 1 <= self.vbuckets <= 1024:
            raise UsageError(f"--vbuckets {self.vbuckets} must be between 1 and 1024")
        if not re.fullmatch(r"[A-Za-z0-9._%-]{1,100}", self.bucket):
            raise UsageError(f"--bucket {self.bucket!r} is not a valid bucket name "
                             "(letters, digits, . _ % -, at most 100)")
        if self.checkpoint_memory < 64 * 1024:
            raise UsageError("--checkpoint-memory must be at least 64KiB")
        if not 0.001 <= self.flush_interval <= 3600:
            raise UsageError("--flush-interval must be between 0.001 and 3600 seconds")
        if not 0.05 <= self.expiry_pager_interval <= 86400:
            raise UsageError("--expiry-pager-interval must be between 0.05 and 86400 seconds")
        if self.checkpoint_max_items < 1:
            raise UsageError("--checkpoint-max-items must be positive")
