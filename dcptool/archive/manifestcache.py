"""Manifests read and checked by earlier commands, kept on this machine.

A committed manifest never changes, yet every command that walks a chain (each backup,
`info`, `restore`, ...) read and checked all of its manifests: ~12 us per vbucket entry,
growing with the chain. A manifest that was read and found well-formed is kept here,
keyed by the file's identity (`storage.identity`: path, device, inode, size and mtime of a
file; size and ETag of an object) and the archive's metadata it was checked against, so
the next command that finds the same file takes the checked document as it is.

The cache is a directory of small files (marshal), one per manifest, private to the user:
DCPTOOL_MANIFEST_CACHE names it (`off` turns the cache off), else
$XDG_CACHE_HOME/dcptool/manifests or ~/.cache/dcptool/manifests. Manifests of encrypted
archives are never kept (they would be kept in the clear). Anything that goes wrong with
the cache (unwritable, damaged, a full disk) costs only the time it would have saved.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import tempfile
from pathlib import Path
from typing import Any

ENV = "DCPTOOL_MANIFEST_CACHE"
#: the layout of a cached file; a new one ignores the files of the old
FORMAT = 1
#: at most this many manifests are kept; past it, the older half goes
MAX_FILES = 4096


def cache_dir() -> Path | None:
    """The cache's directory, or None when DCPTOOL_MANIFEST_CACHE=off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("off", "0", "no", "false"):
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dcptool" / "manifests"


def _key(ident: tuple[Any, ...]) -> str:
    return f"{FORMAT}\0{ident!r}"


def _name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:40] + ".m"


def load(ident: tuple[Any, ...]) -> dict[str, Any] | None:
    """The checked manifest kept for `ident`, or None."""
    directory = cache_dir()
    if directory is None:
        return None
    key = _key(ident)
    try:
        data = (directory / _name(key)).read_bytes()
        held, doc = marshal.loads(data)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    return doc if held == key and isinstance(doc, dict) else None


def store(ident: tuple[Any, ...], doc: dict[str, Any]) -> None:
    """Keep a checked manifest for `ident` (nothing happens when it cannot be)."""
    directory = cache_dir()
    if directory is None:
        return
    key = _key(ident)
    try:
        data = marshal.dumps((key, doc))
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, directory / _name(key))
        except BaseException:
            with _suppress():
                os.unlink(tmp)
            raise
        _trim(directory)
    except (OSError, ValueError):
        return


def _trim(directory: Path) -> None:
    entries = []
    with os.scandir(directory) as it:
        for e in it:
            if e.name.endswith(".m"):
                entries.append(e)
    if len(entries) <= MAX_FILES:
        return
    def age(e: os.DirEntry) -> int:
        try:
            return e.stat().st_mtime_ns
        except OSError:
            return 0
    entries.sort(key=age)
    for e in entries[: len(entries) - MAX_FILES // 2]:
        with _suppress():
            os.unlink(e.path)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> bool:
        return typ is not None and issubclass(typ, OSError)
