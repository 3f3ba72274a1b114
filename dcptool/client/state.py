"""Session state on disk: the vbucket positions as one JSON file, written atomically.

    {"format": "dcptool-session", "version": 1, "bucket": "default",
     "updated": "2024-01-01T00:00:00Z",
     "vbuckets": {"0": {"uuid": ..., "seqno": ..., "snap_start": ..., "snap_end": ...,
                        "failover_log": [[uuid, seqno], ...], "snapshot_ends": [...]}}}

The file is written to a temporary name in the same directory, fsynced, renamed over
the old one and the directory fsynced: a crash leaves the old or the new state, never half.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StateFileError
from .position import Position

FORMAT = "dcptool-session"
VERSION = 1


@dataclass
class SessionState:
    positions: dict[int, Position] = field(default_factory=dict)
    bucket: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "bucket": self.bucket,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **({"meta": self.meta} if self.meta else {}),
            "vbuckets": {str(vb): p.to_dict() for vb, p in sorted(self.positions.items())},
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "state") -> "SessionState":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise StateFileError(f"{source} is not a dcptool session state file")
        if d.get("version") != VERSION:
            raise StateFileError(f"{source} has state version {d.get('version')!r}; "
                                 f"this dcptool reads version {VERSION}")
        try:
            positions = {int(vb): Position.from_dict(p) for vb, p in d.get("vbuckets", {}).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise StateFileError(f"{source}: {exc}") from None
        return cls(positions, d.get("bucket"), d.get("meta") or {})


def save_state(path: str | os.PathLike, state: SessionState) -> None:
    """Write `state` to `path` atomically."""
    path = Path(path)
    data = json.dumps(state.to_dict(), separators=(",", ":")).encode()
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise StateFileError(f"cannot write state file {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StateFileError(f"cannot write state file {path}: {exc.strerror or exc}") from None
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def load_state(path: str | os.PathLike) -> SessionState:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StateFileError(f"state file {path} does not exist") from None
    except OSError as exc:
        raise StateFileError(f"cannot read state file {path}: {exc.strerror or exc}") from None
    try:
        d = json.loads(raw)
    except ValueError as exc:
        raise StateFileError(f"state file {path} is not valid JSON: {exc}") from None
    return SessionState.from_dict(d, f"state file {path}")
