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
from contextlib import contextmanager
from typing import Any, Iterator

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


def table_console() -> Console:
    """The stdout console for a table: a terminal's width; piped, the width COLUMNS gives,
    or 200 columns when COLUMNS is not set (a file has no width to fit)."""
    con = console()
    if not con.is_terminal and not os.environ.get("COLUMNS"):
        con.width = max(con.width, 200)
    return con


def console(stderr: bool = False) -> Console:
    """A rich console for stdout (or stderr): colour only on a terminal and without NO_COLOR.

    rich already leaves colour out when the stream is not a terminal; `no_color` is passed
    explicitly so NO_COLOR wins even where rich is told the stream is a terminal.
    """
    return Console(stderr=stderr, no_color=no_color(), highlight=False)


def show_progress(disabled: bool = False) -> bool:
    """Whether to draw a progress bar (on stderr): only on a terminal and not in quiet mode."""
    return not disabled and not is_quiet() and stderr_is_terminal()


#: the console of the progress bar on screen, if one is: notes go through it, so they are
#: printed on lines of their own above the bar, never glued onto the bar's line
_live_console: Console | None = None


def note(message: str) -> None:
    """A remark on stderr that is not a result ("resuming partial backup ..."); --quiet drops it."""
    if not is_quiet():
        (_live_console or console(stderr=True)).print(message, markup=False, highlight=False,
                                                      soft_wrap=True)


#: the columns a progress bar leaves free at the right of the terminal: the terminal's echo of
#: Ctrl-C ("^C", two columns) lands there, after the bar, and does not wrap onto a line of
#: its own (a bar as wide as the terminal would be pushed up by it, out of reach of the
#: erasing, and stay on the screen above the line that says what the interruption left)
BAR_MARGIN = 2


class _Narrower:
    """Render `inner` `margin` columns narrower than the console."""

    def __init__(self, inner: Any, margin: int) -> None:
        self.inner, self.margin = inner, margin

    def __rich_console__(self, con: Console, options: Any) -> Any:
        yield from con.render(self.inner,
                              options.update(width=max(1, options.max_width - self.margin)))


def new_bar(detail: bool = True, endless: bool = False):
    """A rich progress bar on stderr, the one every command draws: the stage, the bar, the
    percentage, a detail column (counts), the time elapsed; BAR_MARGIN columns short of the
    terminal's width. `endless` (work with no end, a continuous backup's): no bar and no
    percentage, the detail has the room. Start it with `live_bar`."""
    from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn)

    class Bar(Progress):
        def get_renderable(self) -> Any:
            return _Narrower(super().get_renderable(), BAR_MARGIN)

    cols = [TextColumn("[bold]{task.description}")]
    if not endless:
        cols += [BarColumn(), TaskProgressColumn()]
    if detail:
        cols.append(TextColumn("{task.fields[detail]}"))
    cols.append(TimeElapsedColumn())
    return Bar(*cols, console=console(stderr=True))


@contextmanager
def live_bar(bar) -> Iterator[Any]:
    """Show `bar` for the block; notes printed meanwhile go above it. After Ctrl-C the bar
    is taken off the screen, so the interruption is one line."""
    global _live_console
    from dcptool.errors import was_interrupted

    bar.start()
    _live_console = bar.console
    try:
        yield bar
    except BaseException as exc:
        # Ctrl-C is one line: the bar goes (a failure leaves it where it stopped)
        if isinstance(exc, KeyboardInterrupt) or was_interrupted():
            bar.live.transient = True
        raise
    finally:
        _live_console = None
        bar.stop()


@contextmanager
def spark_progress(label: str, disabled: bool = False) -> Iterator[None]:
    """A progress bar for a Spark command (restore, export, merge, prune, remove, verify
    --against) while the block runs, when `show_progress` allows one: the pipeline's
    stages ("starting Spark", ...) with no total, then `label` over the work done out of
    its total, in the unit the pipeline reports (records when the tasks report them, else
    tasks); it ends at 100% when the block returns (not when it fails)."""
    if not show_progress(disabled):
        yield
        return
    from dcptool.pipeline import progress

    bar = new_bar()
    task = bar.add_task("preparing", total=None, detail="")
    seen: dict[str, Any] = {"total": None, "unit": "tasks"}

    def sink(p: dict[str, Any]) -> None:
        if p["phase"] == progress.WORK:
            total = p["total"]
            seen.update(total=total, unit=p["unit"])
            bar.update(task, description=label, total=total, completed=p["done"],
                       detail=f"{p['done']:,}/{total:,} {p['unit']}" if total is not None
                       else "waiting for Spark's tasks", refresh=True)
        else:
            bar.update(task, description=p["phase"], total=None, completed=0, detail="")

    with live_bar(bar), progress.reporting(sink):
        try:
            yield
        except BaseException:
            if seen["total"] is None:  # failed before any work: the error line alone
                bar.live.transient = True
            raise
        total = seen["total"] or 1
        bar.update(task, description=label, total=total, completed=total,
                   detail=f"{total:,}/{total:,} {seen['unit']}" if seen["total"] else "done")


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
    """A byte count for people, the one unit style of every command: `512 B`, `1.5 KiB`,
    ... `2.0 TiB` (powers of 1024); None is `-`. Sizes of backups and archives are always
    the bytes of their files (see `dcptool.archive.info.dir_size`)."""
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


def plural(n: int, word: str, words: str | None = None) -> str:
    """`1 backup`, `2 backups`, `0 backups` (`words`: an irregular plural)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def human_rate(per_second: float | None) -> str:
    """Items per second for people: `12,345`, `42.5`, `0.57`; `-` when nothing was timed
    or nothing moved (never a rounded `0`)."""
    if not per_second or per_second <= 0:
        return "-"
    if per_second >= 100:
        return f"{per_second:,.0f}"
    if per_second >= 1:
        return f"{per_second:.1f}"
    return f"{per_second:.2g}"


def timing(seconds: float, startup: float | None = None) -> str:
    """`12.3 s` or `12.3 s (Spark start-up 2.1 s)`: how long a command took."""
    text = f"{seconds:.1f} s"
    if startup:
        text += f" (Spark start-up {startup:.1f} s)"
    return text


def print_table(con: Console, columns: list[str], rows: list[list[str]], *,
                title: str | None = None, right: tuple[str, ...] = (),
                wrap: tuple[str, ...] = (), optional: tuple[str, ...] = (),
                wrap_at: int = 30) -> None:
    """A table laid out for the width of `con`: every column at full width when the table
    fits; else without the `optional` columns (those that repeat what another says, such
    as a time the backup id holds); else a record view (a block per row: its first cell,
    then `column: value` lines), so no cell is cut off and no column squeezed to nothing.
    A column with no value in any row is left out. Cells may hold rich markup. `wrap`
    names columns whose cells may wrap (free text; the table fits when it does with them
    wrapped at `wrap_at` characters), `right` those aligned right."""
    from rich.markup import render
    from rich.table import Table

    def blank(v: Any) -> bool:
        return render(str(v)).plain.strip() in ("", "-")

    keep = [i for i, c in enumerate(columns) if any(not blank(r[i]) for r in rows)]
    if not keep:
        keep = list(range(len(columns)))
    cols = [columns[i] for i in keep]
    rows = [[r[i] for i in keep] for r in rows]

    def table(names: list[str], wrap_at: int | None) -> Table:
        t = Table(title=title)
        for c in names:
            t.add_column(c, justify="right" if c in right else "left",
                         no_wrap=c not in wrap, overflow="fold",
                         max_width=wrap_at if c in wrap else None)
        idx = [cols.index(c) for c in names]
        for r in rows:
            t.add_row(*(r[i] for i in idx))
        return t

    wide = con.options.update_width(100_000)
    for names in (cols, [c for c in cols if c not in optional]):
        # the width the table needs, its free-text columns wrapped at `wrap_at` characters
        if con.measure(table(names, wrap_at), options=wide).maximum <= con.width:
            con.print(table(names, None))
            return
    if title:
        con.print(f"[bold]{title}[/bold]")
    label = max(len(c) for c in cols[1:]) if len(cols) > 1 else 0
    for n, r in enumerate(rows):
        if n:
            con.print("")
        con.print(f"[bold]{cols[0]}[/bold] {r[0]}", soft_wrap=False)
        for c, v in zip(cols[1:], r[1:]):
            if blank(v):
                continue
            con.print(f"  {c + ':':<{label + 1}} {v}")


def backup_id_arg(archive: Any, given: str | None, option: str = "--backup") -> str | None:
    """The committed backup `given` names in `archive` (a path or an open Archive): its full
    id, or an unambiguous prefix of one (`20261122T10`). None stays None. Unknown or
    ambiguous: a usage error in one line."""
    if given is None:
        return None
    from dcptool.archive import Archive
    from dcptool.errors import UsageError

    arch = archive if isinstance(archive, Archive) else Archive.open(archive)
    ids = arch.committed_ids()
    if given in ids:
        return given
    found = [i for i in ids if i.startswith(given)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise UsageError(f"{option} {given}: no committed backup in {arch.path} has this id "
                         "or begins with it", hint=f"'dcptool info {arch.path}' lists them")
    shown = ", ".join(found[:4]) + (" ..." if len(found) > 4 else "")
    raise UsageError(f"{option} {given}: ambiguous, {len(found)} backups begin with it "
                     f"({shown})", hint="give more of the id")


def expiry_time(expiry: int | None) -> str:
    """A document's expiry as people read it: `2026-11-27 10:00:00Z` (UTC), `never` for 0,
    `-` when not known."""
    if expiry is None:
        return "-"
    if not expiry:
        return "never"
    import time

    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(int(expiry)))
