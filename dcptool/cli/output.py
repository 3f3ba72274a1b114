"""Shared output helpers: JSON, rich consoles that respect NO_COLOR and pipes, verbosity.

Every command prints through these, so the global options behave the same everywhere:

* results go to stdout (tables on a terminal, `--json` for scripts);
* notes, progress and summaries go to stderr, and `dcptool --quiet` silences them;
* `dcptool --verbose` (`-v`) adds detail on stderr (what is being done, where the run log
  is); `-vv` adds debug detail and tracebacks for errors;
* colour only on a terminal and never when `NO_COLOR` is set (https://no-color.org);
  progress bars only when stderr is a terminal.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

QUIET = -1
NORMAL = 0
VERBOSE = 1
DEBUG = 2

_verbosity = NORMAL


def set_verbosity(level: int) -> None:
    """Set the process-wide verbosity (QUIET, NORMAL, VERBOSE or DEBUG)."""
    global _verbosity
    _verbosity = max(QUIET, min(DEBUG, int(level)))
    from dcptool import runlog

    # run logs (backup, restore, merge) are echoed on stderr in verbose mode
    runlog.set_echo(None if _verbosity < VERBOSE else ("DEBUG" if _verbosity >= DEBUG else "INFO"),
                    quiet=_verbosity <= QUIET)
    from dcptool.pipeline import runtime

    # Spark's own output (JVM start-up and shutdown lines, its workers') only with -vv
    runtime.set_jvm_output("terminal" if _verbosity >= DEBUG else "quiet")
    # why a running dcptool engine was not used (notes: stderr, silenced by -q)
    runtime.set_note_sink(note)


_json_errors = False


def set_json_errors(on: bool) -> None:
    """Errors as one JSON object on stderr (the command was given --json)."""
    global _json_errors
    _json_errors = bool(on)


def json_errors() -> bool:
    return _json_errors


def verbosity() -> int:
    return _verbosity


def is_quiet() -> bool:
    return _verbosity <= QUIET


def is_verbose() -> bool:
    return _verbosity >= VERBOSE


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def no_color() -> bool:
    """True when colour is off by request: NO_COLOR set to anything but the empty string."""
    return bool(os.environ.get("NO_COLOR"))


def console(stderr: bool = False) -> Console:
    """A rich console for stdout (or stderr): colour only on a terminal and without NO_COLOR.

    rich already leaves colour out when the stream is not a terminal; `no_color` is passed
    explicitly so NO_COLOR wins even where rich is told the stream is a terminal.
    """
    return Console(stderr=stderr, no_color=no_color(), highlight=False)


def show_progress(disabled: bool = False) -> bool:
    """Whether to draw a progress bar (on stderr): only on a terminal and not in quiet mode."""
    return not disabled and not is_quiet() and stderr_is_terminal()


def note(message: str) -> None:
    """A remark on stderr that is not a result ("resuming partial backup ..."); --quiet drops it."""
    if not is_quiet():
        console(stderr=True).print(message, markup=False, highlight=False, soft_wrap=True)


def detail(message: str) -> None:
    """Extra information on stderr shown only with --verbose."""
    if is_verbose():
        console(stderr=True).print(message, markup=False, highlight=False, soft_wrap=True)


def _default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).hex()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def print_json(obj: Any, *, pretty: bool = False) -> None:
    text = json.dumps(obj, indent=2 if pretty else None, default=_default, sort_keys=False)
    sys.stdout.write(text + "\n")


def human_bytes(n: float | None) -> str:
    """A byte count for people: `512 B`, `1.5 KiB`, ... `2.0 TiB`; None is `-`."""
    if n is None:
        return "-"
    size = n
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def rough_duration(seconds: float) -> str:
    """A duration as a person reads it at a glance: 45s, 12m, 5h, 3d."""
    from dcptool.node.config import format_duration

    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return format_duration(86400 * (s // 86400))
