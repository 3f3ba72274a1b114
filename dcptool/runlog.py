"""Run logs: one file per backup, restore or merge run in `ARCHIVE/logs/`, and the node's log.

A run log says what a run did, for the operator reading it the next morning: the plan,
one line per vbucket (start and end positions, counts, bytes, retries, time), every
rollback, and how the run ended. Lines look like

    2026-11-22T10:15:02.123Z INFO vbucket 12: seqno 100 -> 250 (uuid 0x3f2a...), ...

Files are named `KIND-YYYYMMDDTHHMMSS.ffffffZ.log` (the UTC start time, so names sort by
age), created with mode 0600 in a 0700 directory, and rotated: when a run starts, only the
newest `keep` logs of its kind are kept (default 20, `DCPTOOL_LOG_KEEP` to change it).

Usage (a run that only knows its archive once it exists, like backup, starts logging at
once; what it logs before `attach` is written when the file opens):

    with RunLog("merge") as rl:
        rl.attach(archive_path)
        rl.info("merging %d backups: %s .. %s", n, first, last)
        ...
    # an exception leaving the block is logged as "failed: ..." before it propagates
    # ("interrupted" after Ctrl-C, whatever error followed it)

A log that cannot be written (read-only archive, full disk) never fails the run: one note
goes to stderr and the run carries on without a log.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dcptool.errors import Interrupted, was_interrupted

LOG_DIR = "logs"
DEFAULT_KEEP = 20
KEEP_ENV = "DCPTOOL_LOG_KEEP"
FILE_MODE = 0o600
DIR_MODE = 0o700

#: stderr echo of run logs: None (off) or a level name; set by the CLI's --verbose
_echo_level: int | None = None
_quiet = False


def set_echo(level: str | int | None, *, quiet: bool = False) -> None:
    """Echo run log lines at `level` and above on stderr (None: do not echo)."""
    global _echo_level, _quiet
    _echo_level = logging.getLevelName(level) if isinstance(level, str) else level
    _quiet = quiet


def keep_from_env(default: int = DEFAULT_KEEP) -> int:
    raw = os.environ.get(KEEP_ENV, "").strip()
    if not raw:
        return default
    try:
        return max(1, int(raw))
    except ValueError:
        return default


class UTCFormatter(logging.Formatter):
    """`2026-11-22T10:15:02.123Z LEVEL message`: UTC, millisecond precision."""

    def __init__(self, fmt: str = "%(asctime)s %(levelname)s %(message)s") -> None:
        super().__init__(fmt)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        t = datetime.fromtimestamp(record.created, tz=timezone.utc)
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _open_private(path: str, encoding: str | None, errors: str | None = None):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:  # pragma: no cover - a file system without modes
        pass
    return os.fdopen(fd, "a", encoding=encoding or "utf-8", errors=errors)


class _QuietErrors:
    """A handler that cannot write says so once on stderr and goes silent (no traceback)."""

    _failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if self._failed:
            return
        self._failed = True
        exc = sys.exc_info()[1]
        if not _quiet:
            print(f"dcptool: note: cannot write the log {getattr(self, 'baseFilename', '')}: "
                  f"{getattr(exc, 'strerror', None) or exc}", file=sys.stderr)


class PrivateFileHandler(_QuietErrors, logging.FileHandler):
    """A FileHandler whose file is created with mode 0600."""

    def _open(self):
        return _open_private(self.baseFilename, self.encoding, self.errors)


class PrivateRotatingFileHandler(_QuietErrors, logging.handlers.RotatingFileHandler):
    """A size-rotated log (`node.log`, `node.log.1`, ...) whose files have mode 0600."""

    def _open(self):
        return _open_private(self.baseFilename, self.encoding, self.errors)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` (mode 0700) if needed and return it."""
    p = Path(path)
    p.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return p


def _stamp(t: datetime) -> str:
    return t.strftime("%Y%m%dT%H%M%S.%fZ")


def log_name_re(kind: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(kind)}-\d{{8}}T\d{{6}}\.\d{{6}}Z(?:-\d+)?\.log$")


def run_logs(directory: str | os.PathLike[str], kind: str) -> list[Path]:
    """The run logs of `kind` in `directory`, oldest first."""
    pat = log_name_re(kind)
    try:
        names = [n for n in os.listdir(directory) if pat.match(n)]
    except OSError:
        return []
    return [Path(directory) / n for n in sorted(names)]


def rotate(directory: str | os.PathLike[str], kind: str, keep: int) -> list[Path]:
    """Delete all but the newest `keep` run logs of `kind`; return the deleted paths."""
    logs = run_logs(directory, kind)
    gone = logs[:max(0, len(logs) - max(1, keep))]
    for p in gone:
        try:
            p.unlink()
        except OSError:
            pass
    return gone


class _Buffer(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class RunLog:
    """The log of one run of `kind` (backup, restore, merge)."""

    def __init__(self, kind: str, *, keep: int | None = None) -> None:
        self.kind = kind
        self.keep = keep if keep is not None else keep_from_env()
        self.started = datetime.now(timezone.utc)
        self.path: Path | None = None
        # not registered with logging.getLogger: nothing outlives the run, nothing propagates
        self.logger = logging.Logger(f"dcptool.run.{kind}", logging.DEBUG)
        self.logger.propagate = False
        self._buffer: _Buffer | None = _Buffer()
        self.logger.addHandler(self._buffer)
        self._file: logging.Handler | None = None
        self._closed = False
        if _echo_level is not None:
            echo = logging.StreamHandler(sys.stderr)
            echo.setLevel(_echo_level)
            echo.setFormatter(logging.Formatter(f"{kind}: %(message)s"))
            # the CLI prints the error itself; the log file gets it too
            echo.addFilter(lambda record: not getattr(record, "no_echo", False))
            self.logger.addHandler(echo)

    # -- writing ------------------------------------------------------------------------

    def debug(self, msg: str, *args: Any) -> None:
        self.logger.debug(msg, *args)

    def info(self, msg: str, *args: Any) -> None:
        self.logger.info(msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        self.logger.warning(msg, *args)

    def error(self, msg: str, *args: Any) -> None:
        self.logger.error(msg, *args)

    # -- the file -----------------------------------------------------------------------

    def attach(self, archive_dir: str | os.PathLike[str]) -> Path | None:
        """Open `ARCHIVE/logs/KIND-START.log`, write what was logged so far, rotate old logs.

        Returns the path, or None when the log cannot be written (a note says why)."""
        if self._file is not None or self._closed:
            return self.path
        text = str(archive_dir)
        scheme, sep, rest = text.partition("://")
        if sep and scheme.isalnum():
            # an archive in a store that is not this machine's files (s3://...): the log
            # stays on this machine, under the cache directory, by store, bucket and prefix
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
            directory = Path(cache, "dcptool", "logs", scheme, *rest.strip("/").split("/"))
        else:
            directory = Path(archive_dir) / LOG_DIR
        try:
            private_dir(directory)
            path = self._new_file(directory)
            handler = PrivateFileHandler(str(path), encoding="utf-8")
        except OSError as exc:
            if not _quiet:
                print(f"dcptool: note: cannot write a {self.kind} log in {directory}: "
                      f"{exc.strerror or exc}; carrying on without it", file=sys.stderr)
            self._drop_buffer()
            return None
        handler.setFormatter(UTCFormatter())
        handler.setLevel(logging.DEBUG)
        if self._buffer is not None:
            for record in self._buffer.records:
                handler.handle(record)
        self._drop_buffer()
        self.logger.addHandler(handler)
        self._file = handler
        self.path = path
        rotate(directory, self.kind, self.keep)
        self.logger.debug("log file %s (keeping the newest %d %s logs)", path, self.keep, self.kind)
        return path

    def _new_file(self, directory: Path) -> Path:
        base = f"{self.kind}-{_stamp(self.started)}"
        for n in range(1000):
            path = directory / (f"{base}.log" if n == 0 else f"{base}-{n}.log")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            except FileExistsError:
                continue
            os.close(fd)
            return path
        raise OSError(f"too many {self.kind} logs started at {base}")

    def _drop_buffer(self) -> None:
        if self._buffer is not None:
            self.logger.removeHandler(self._buffer)
            self._buffer = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_buffer()
        for h in list(self.logger.handlers):
            self.logger.removeHandler(h)
            try:
                h.close()
            except OSError:  # pragma: no cover
                pass

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            quiet = {"no_echo": True}
            if isinstance(exc, Interrupted):
                self.logger.error("%s", exc.message, extra=quiet)
            elif isinstance(exc, KeyboardInterrupt) or was_interrupted():
                # after Ctrl-C, a failure is its consequence (a refused connection to the
                # killed JVM, say), not its cause
                self.logger.error("interrupted", extra=quiet)
            else:
                msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                hint = getattr(exc, "hint", None)
                self.logger.error("failed: %s%s", msg, f" ({hint})" if hint else "", extra=quiet)
        self.close()


def node_log_handler(data_dir: str | os.PathLike[str], *, max_bytes: int = 16 << 20,
                     backups: int = 5) -> PrivateRotatingFileHandler:
    """The handler for the node's `DIR/logs/node.log` (rotated by size: node.log.1 ... .5)."""
    directory = private_dir(Path(data_dir) / LOG_DIR)
    handler = PrivateRotatingFileHandler(str(directory / "node.log"), maxBytes=max_bytes,
                                         backupCount=backups, encoding="utf-8")
    from dcptool.logsafe import one_line_formatter

    handler.setFormatter(one_line_formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                            base=UTCFormatter))
    return handler


__all__ = ["RunLog", "LOG_DIR", "DEFAULT_KEEP", "KEEP_ENV", "node_log_handler", "rotate",
           "run_logs", "set_echo", "UTCFormatter", "PrivateFileHandler",
           "PrivateRotatingFileHandler"]
