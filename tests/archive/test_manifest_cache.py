"""The manifests a command read and checked are kept for the next command
(dcptool/archive/manifestcache.py): keyed by the file's identity, never for an encrypted
archive, off with DCPTOOL_MANIFEST_CACHE=off."""
from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest
from archiveutil import seed_004_archive

from dcptool.archive import Archive, manifestcache
from dcptool.archive import archive as archive_mod


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv(manifestcache.ENV, str(d))
    archive_mod._MANIFESTS.clear()  # noqa: SLF001 - this process's memory of manifests
    return d


def _read_in_new_process(path: Path, bid: str, env: dict[str, str]) -> dict:
    """The manifest as `Archive.manifest` gives it in a process of its own."""
    code = ("import json, sys; from dcptool.archive import Archive; "
            "print(json.dumps(Archive.open(sys.argv[1]).manifest(sys.argv[2])))")
    r = subprocess.run([sys.executable, "-c", code, str(path), bid], env={**os.environ, **env},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _cached_file(cache: Path) -> Path:
    files = sorted(cache.glob("*.m"))
    assert files, "nothing kept"
    return files[-1]


def test_a_checked_manifest_is_kept_and_served_to_the_next_command(tmp_path, cache):
    archive, full, inc = seed_004_archive(tmp_path / "a")
    # the commits kept what they wrote: one file per manifest
    assert len(list(cache.glob("*.m"))) == 2
    for f in cache.glob("*.m"):
        assert f.stat().st_mode & 0o077 == 0
    assert cache.stat().st_mode & 0o077 == 0
    assert _read_in_new_process(archive.path, inc["id"], {}) == json.loads(
        (archive.backup_dir(inc["id"]) / "manifest.json").read_text())

    # the next process takes the kept document as it is, without reading the file: a
    # marked copy in the cache comes back
    for f in cache.glob("*.m"):
        key, doc = marshal.loads(f.read_bytes())
        if doc["id"] == inc["id"]:
            doc["extra"]["marked"] = True
            f.write_bytes(marshal.dumps((key, doc)))
    assert _read_in_new_process(archive.path, inc["id"], {})["extra"].get("marked") is True

    # a manifest file that changed (another size, another mtime) is read and checked again
    path = archive.backup_dir(inc["id"]) / "manifest.json"
    text = json.loads(path.read_text())
    path.write_text(json.dumps(text, indent=1))
    got = _read_in_new_process(archive.path, inc["id"], {})
    assert "marked" not in got["extra"] and got == text

    # a damaged one is refused as before, whatever the cache holds
    path.write_text(path.read_text()[:100])
    code = ("import sys; from dcptool.archive import Archive; "
            "Archive.open(sys.argv[1]).manifest(sys.argv[2])")
    r = subprocess.run([sys.executable, "-c", code, str(archive.path), inc["id"]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "CorruptFileError" in r.stderr and "unreadable" in r.stderr


def test_a_damaged_cache_file_costs_only_a_read(tmp_path, cache):
    archive, full, inc = seed_004_archive(tmp_path / "a")
    for f in cache.glob("*.m"):
        f.write_bytes(b"\x00garbage")
    archive_mod._MANIFESTS.clear()  # noqa: SLF001
    assert Archive.open(archive.path).manifest(full["id"])["id"] == full["id"]
    # and it is kept again, whole
    assert any(marshal.loads(f.read_bytes())[1]["id"] == full["id"]
               for f in cache.glob("*.m") if f.read_bytes()[:1] != b"\x00")


def test_off_keeps_nothing(tmp_path, monkeypatch, cache):
    monkeypatch.setenv(manifestcache.ENV, "off")
    archive, full, inc = seed_004_archive(tmp_path / "a")
    archive_mod._MANIFESTS.clear()  # noqa: SLF001
    assert Archive.open(archive.path).manifest(inc["id"])["id"] == inc["id"]
    assert not cache.exists()


def test_an_encrypted_archive_s_manifests_are_never_kept(tmp_path, cache):
    from archiveutil import W, backup, mutations

    from dcptool.archive import ArchivePosition

    a = Archive.create(tmp_path / "enc", bucket="b", vbuckets=2, passphrase="cache-secret")
    m = backup(a, "full", {0: {"start": ArchivePosition.at(W, 0),
                               "end": ArchivePosition.at(W, 10), "events": mutations(1, 10)}})
    archive_mod._MANIFESTS.clear()  # noqa: SLF001
    assert Archive.open(a.path, passphrase="cache-secret").manifest(m["id"])["id"] == m["id"]
    assert not cache.exists() or not list(cache.glob("*.m"))
