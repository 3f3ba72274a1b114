"""Shared output helpers: JSON lines, rich consoles that respect NO_COLOR and pipes."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def console(stderr: bool = False) -> Console:
    no_color = bool(os.environ.get("NO_COLOR"))
    return Console(stderr=stderr, no_color=no_color, highlight=False)


def _default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).hex()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def print_json(obj: Any, *, pretty: bool = False) -> None:
    text = json.dumps(obj, indent=2 if pretty else None, default=_default, sort_keys=False)
    sys.stdout.write(text + "\n")
