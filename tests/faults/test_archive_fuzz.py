"""Fuzzing the archive reader: damaged copies of a small real archive (a full and an
incremental backup) made by a seeded loop: flipped bytes, truncated, zero-length, deleted,
grown and swapped data files, swapped manifests, garbage or wrong JSON in manifest.json and
archive.json, a broken chain. For every variant:

* `dcptool verify` fails (exit 1; exit 2 when archive.json itself is unreadable, as for any
  directory that is not an archive) naming the damaged file (for an archive.json with
  another uuid: the manifests that no longer belong to it), never with a traceback;
* `dcptool restore` fails with one clear line and writes nothing at all into the node
  (restore checks the size and SHA-256 of every file of the chain before it sends a record).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest
from docutil import delete, load, opts_for
from faultutil import cli, docs, one_error_line
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.pipeline.backup import run_backup

VBS = 8
#: 5 of each kind in the suite; DCPTOOL_FUZZ_VARIANTS=N for a longer run
VARIANTS = int(os.environ.get("DCPTOOL_FUZZ_VARIANTS", "55"))
SEED = 20261122


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, spark):
    base = tmp_path_factory.mktemp("fuzz")
    with NodeProcess(base / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(800, "a"), VBS)
        run_backup(opts, base / "archive", spark=spark, watermark=False)
        with opts.connect() as conn:
            load(conn, docs(300, "b"), VBS)
            delete(conn, [f"doc::a::{i:05d}" for i in range(0, 800, 7)], VBS)
        run_backup(opts, base / "archive", spark=spark, watermark=False)
    a = Archive.open(base / "archive")
    assert len(a.committed_ids()) == 2
    return base / "archive"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("fuzz-dst") / "dst", vbuckets=VBS) as node:
        yield node


def _data_files(archive: Path) -> list[Path]:
    return sorted(archive.glob("backups/*/vb-*.mpk.zst"))


def _manifests(archive: Path) -> list[Path]:
    return sorted(archive.glob("backups/*/manifest.json"))


# each mutation damages a copy of the archive and returns the text (a file name or a backup
# id) the verify report must name


def flip_bytes(a: Path, rng: random.Random) -> str:
    f = rng.choice(_data_files(a))
    data = bytearray(f.read_bytes())
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(data))
        data[i] ^= rng.randint(1, 255)
    f.write_bytes(bytes(data))
    return f.name


def truncate(a: Path, rng: random.Random) -> str:
    f = rng.choice(_data_files(a))
    size = f.stat().st_size
    os.truncate(f, rng.randrange(1, size))
    return f.name


def zero_length(a: Path, rng: random.Random) -> str:
    f = rng.choice(_data_files(a))
    os.truncate(f, 0)
    return f.name


def delete_file(a: Path, rng: random.Random) -> str:
    f = rng.choice(_data_files(a))
    f.unlink()
    return f.name


def append_garbage(a: Path, rng: random.Random) -> str:
    f = rng.choice(_data_files(a))
    with open(f, "ab") as fh:
        fh.write(rng.randbytes(rng.randint(1, 64)))
    return f.name


def swap_files(a: Path, rng: random.Random) -> str:
    files = _data_files(a)
    if rng.random() < 0.5:  # two vbuckets of one backup
        bdir = rng.choice(sorted({f.parent for f in files}))
        x, y = rng.sample([f for f in files if f.parent == bdir], 2)
    else:  # the same vbucket's file in the two backups
        name = rng.choice(files).name
        x, y = [f for f in files if f.name == name][:2]
    tmp = x.with_name("swap.tmp")
    x.rename(tmp)
    y.rename(x)
    tmp.rename(y)
    return x.name


def swap_manifests(a: Path, rng: random.Random) -> str:
    x, y = _manifests(a)
    tx, ty = x.read_bytes(), y.read_bytes()
    x.write_bytes(ty)
    y.write_bytes(tx)
    return "manifest.json"


def manifest_garbage(a: Path, rng: random.Random) -> str:
    m = rng.choice(_manifests(a))
    text = m.read_bytes()
    choice = rng.randrange(5)
    if choice == 0:
        m.write_bytes(rng.randbytes(rng.randint(0, 200)))
    elif choice == 1:
        m.write_bytes(text[:rng.randrange(len(text))])
    elif choice == 2:
        m.write_bytes(rng.choice([b"[]", b"{}", b"null", b"42", b'"manifest"']))
    elif choice == 3:  # a required field removed
        doc = json.loads(text)
        del doc[rng.choice(["id", "vbuckets", "format", "archive", "type", "version"])]
        m.write_text(json.dumps(doc))
    else:  # a required field of the wrong type
        doc = json.loads(text)
        doc[rng.choice(["id", "vbuckets", "version", "parent", "totals"])] = rng.choice(
            [None, 7, "x", [], {}])
        m.write_text(json.dumps(doc))
    return str(m.parent.name)


def manifest_file_entry(a: Path, rng: random.Random) -> str:
    """A data file's size, hash or name in the manifest changed (the file left alone)."""
    m = rng.choice(_manifests(a))
    doc = json.loads(m.read_text())
    entry = rng.choice(doc["vbuckets"])
    f = rng.choice(entry["files"])
    choice = rng.randrange(3)
    if choice == 0:
        f["size"] += rng.choice([-1, 1, 1000])
    elif choice == 1:
        f["sha256"] = f"{rng.getrandbits(256):064x}"
    else:
        other = rng.choice([e for e in doc["vbuckets"] if e is not entry])
        f["name"] = other["files"][0]["name"]
    m.write_text(json.dumps(doc))
    return str(m.parent.name)


def archive_json(a: Path, rng: random.Random) -> str:
    p = a / "archive.json"
    choice = rng.randrange(4)
    if choice == 0:
        p.write_bytes(rng.randbytes(rng.randint(0, 100)))
    elif choice == 1:
        p.write_bytes(p.read_bytes()[:rng.randrange(p.stat().st_size)])
    elif choice == 2:
        p.unlink()
    else:
        doc = json.loads(p.read_text())
        doc[rng.choice(["format", "version", "uuid", "vbuckets"])] = rng.choice(
            [None, "x", -1, 99, []])
        p.write_text(json.dumps(doc))
    return "archive.json"


def broken_chain(a: Path, rng: random.Random) -> str:
    """The full backup's manifest is gone: the incremental has no committed parent."""
    first = _manifests(a)[0]
    first.unlink()
    return first.parent.name


#: damage restore's error line must name a data file for
NAMES_A_DATA_FILE = (flip_bytes, truncate, zero_length, delete_file, append_garbage, swap_files)

MUTATIONS = [flip_bytes, truncate, zero_length, delete_file, append_garbage, swap_files,
             swap_manifests, manifest_garbage, manifest_file_entry, archive_json, broken_chain]


def test_damaged_archives_fail_verify_and_restore_clearly(pristine, target, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.setenv("DCPTOOL_PASSWORD", target.password)
    rng = random.Random(SEED)
    addr = f"{target.host}:{target.port}"
    # the pristine archive is sound (so every failure below comes from the damage)
    rc, out, err = cli(capsys, "verify", pristine)
    assert rc == 0, out + err
    ran: dict[str, int] = {}
    spent = {"verify": 0.0, "restore": 0.0}
    codes: dict[str, set[int]] = {}  # restore's exit statuses per kind
    for i in range(VARIANTS):
        mutate = MUTATIONS[i % len(MUTATIONS)]
        copy = tmp_path / f"v{i:03d}"
        shutil.copytree(pristine, copy)
        named = mutate(copy, rng)
        what = f"variant {i} ({mutate.__name__}, {named})"

        t0 = time.monotonic()
        rc, out, err = cli(capsys, "verify", copy)
        spent["verify"] += time.monotonic() - t0
        assert "Traceback" not in out + err, f"{what}: {out}{err}"
        if mutate is archive_json and rc == 2:  # not an archive any more
            assert named in one_error_line(err), f"{what}: {err}"
        elif mutate is archive_json:  # another uuid: no manifest belongs to it
            assert rc == 1 and "belongs to another archive" in out, f"{what}: {out}{err}"
        else:
            assert rc == 1, f"{what}: exit {rc}: {out}{err}"
            problems = [ln for ln in out.splitlines() if not ln.startswith(("note:", "FAILED:"))]
            assert any(named in ln for ln in problems), f"{what}: {out}"

        t0 = time.monotonic()
        rc, out, err = cli(capsys, "restore", copy, "-c", addr, "--partitions", "2")
        spent["restore"] += time.monotonic() - t0
        assert rc not in (0, None), f"{what}: restore succeeded: {out}{err}"
        line = one_error_line(err)
        assert len(line) < 600, line
        if mutate in NAMES_A_DATA_FILE:
            assert ".mpk.zst" in line, f"{what}: {line}"
        codes.setdefault(mutate.__name__, set()).add(rc)
        with opts_for(target).connect() as conn:
            written = sum(get_vbucket_seqnos(conn, state=1).values())
        assert written == 0, f"{what}: restore wrote {written} items before failing: {line}"
        ran[mutate.__name__] = ran.get(mutate.__name__, 0) + 1
        shutil.rmtree(copy)
    assert sum(ran.values()) == VARIANTS and len(ran) == min(VARIANTS, len(MUTATIONS))
    print(f"archive fuzz: {VARIANTS} variants {ran}; seconds {spent}; restore exit statuses {codes}")
