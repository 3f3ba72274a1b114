"""Progress and numbers a person can trust: a progress bar for every long Spark command on
a terminal (ending at 100%), items/s without Spark's start-up, one size everywhere, the
restore's summary, tables that fit 80 columns, expiry as a time, backup id prefixes and
plurals."""
from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time

import pytest
from cliutil import cli
from docutil import load, opts_for

from dcptool.cli.app import main
from dcptool.cli.output import human_bytes
from dcptool.pipeline.backup import run_backup

VBS = 16
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(monkeypatch, *args, columns: int = 120) -> tuple[int, str, str]:
    """`dcptool ARGS` in this process (the session's Spark) with stderr on a pseudo-terminal:
    (exit status, stdout, what the terminal showed, escapes removed)."""
    master, slave = pty.openpty()
    screen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    term = os.fdopen(slave, "w", buffering=1)
    out = io.StringIO()
    monkeypatch.setenv("COLUMNS", str(columns))
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, term
    try:
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in args])
    finally:
        term.flush()
        sys.stdout, sys.stderr = saved
        term.close()
        reader.join(5)
        os.close(master)
    return exc.value.code, out.getvalue(), ANSI.sub("", bytes(screen).decode(errors="replace"))


def percentages(text: str, label: str) -> list[int]:
    return [int(p) for p in re.findall(rf"{label}\s.*?(\d+)%", text)]


def counts(text: str, label: str) -> list[tuple[int, int, str]]:
    """(done, total, unit) of each drawing of the bar `label` on the screen."""
    return [(int(d.replace(",", "")), int(t.replace(",", "")), u)
            for d, t, u in re.findall(rf"{label}\s.*?\d+%\s+([\d,]+)/([\d,]+) (\w+)", text)]


def assert_counted(screen: str, label: str, total: int, unit: str = "records") -> None:
    """The bar `label` counts `unit` out of `total`, never goes back, is seen between 0 and
    `total` at least once and ends at total/total (100%)."""
    seen = counts(screen, label)
    assert seen, screen
    assert {(t, u) for _d, t, u in seen} == {(total, unit)}, seen
    done = [d for d, _t, _u in seen]
    assert done == sorted(done), done  # never goes back
    assert any(0 < d < total for d in done), done  # it moved while the tasks ran
    assert done[-1] == total and percentages(screen, label)[-1] == 100, screen


def chain_records(path, backup: str | None = None) -> int:
    """The records of the manifest entries of the chain of `backup` (default the newest)."""
    from dcptool.archive import Archive

    archive = Archive.open(path)
    manifests = archive.manifests()
    return sum(e["counts"]["records"] for bid in archive.chain_ids(manifests, backup)
               for e in manifests[bid]["vbuckets"])


#: what makes a small run's bar seen between 0 and its total: each task pauses after each
#: progress report (dcptool/faults.py)
SEEN_BETWEEN = "pause-after-progress:150"


@pytest.fixture
def quick_progress(monkeypatch):
    """Tasks report (and the driver polls) as often as they can, and each task pauses after
    each report: a small run is seen between its start and its end, however fast it is."""
    monkeypatch.setenv("DCPTOOL_PROGRESS_INTERVAL", "0")
    monkeypatch.setenv("DCPTOOL_FAULT", SEEN_BETWEEN)


@pytest.fixture(scope="module")
def archive(shared_node, spark, tmp_path_factory):
    """An archive of two backups of the shared node: a full one and a 2-item incremental."""
    path = tmp_path_factory.mktemp("progress") / "archive"
    with opts_for(shared_node).connect() as conn:
        load(conn, {f"p::{i}": {"i": i} for i in range(400)}, VBS)
    run_backup(opts_for(shared_node), path, spark=spark, watermark=False)
    with opts_for(shared_node).connect() as conn:
        load(conn, {"p::1": {"again": 1}, "p::2": {"again": 2}}, VBS)
    run_backup(opts_for(shared_node), path, spark=spark, watermark=False)
    return path


def test_spark_commands_draw_a_bar_of_records_that_ends_at_100(archive, shared_node, spark,
                                                              tmp_path, monkeypatch,
                                                              quick_progress):
    from dcptool.archive import Archive

    monkeypatch.setenv("DCPTOOL_PASSWORD", shared_node.password)
    target = f"{shared_node.host}:{shared_node.port}"
    records = chain_records(archive)
    a = Archive.open(archive)
    manifests = a.manifests()
    last = {e["vbucket"]: e["end"]["seqno"] for bid in a.chain_ids(manifests)
            for e in manifests[bid]["vbuckets"]}
    # verify --against: the node's seqnos up to where the archive ends, then the records
    # of the archive it resolves
    for label, args, total in (
            ("compare", ("verify", archive, "--against", "-c", target, "--partitions", "1"),
             sum(last.values()) + records),
            ("restore", ("restore", archive, "-c", target, "--force-updates",
                         "--partitions", "1"), records),
            ("dry run", ("restore", archive, "--dry-run", "-c", target), records)):
        rc, out, screen = on_terminal(monkeypatch, *args)
        assert rc == 0, screen
        assert_counted(screen, label, total)
        assert "Traceback" not in screen

    # where the tasks cannot report (here: no temporary directory for their files), the bar
    # counts Spark's tasks and says so
    import tempfile

    with monkeypatch.context() as m:
        m.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
        rc, out, screen = on_terminal(monkeypatch, "restore", archive, "--dry-run", "-c",
                                      target, "--partitions", "3")
    assert rc == 0, screen
    seen = counts(screen, "dry run")
    assert seen and {(t, u) for _d, t, u in seen} == {(3, "tasks")}, screen
    assert seen[-1] == (3, 3, "tasks") and percentages(screen, "dry run")[-1] == 100, screen
    # --json and --no-progress: nothing drawn
    rc, out, screen = on_terminal(monkeypatch, "restore", archive, "--dry-run", "-c", target,
                                  "--json")
    assert rc == 0 and "%" not in screen and json.loads(out)["dry_run"] is True
    rc, out, screen = on_terminal(monkeypatch, "restore", archive, "--dry-run", "-c", target,
                                  "--no-progress")
    assert rc == 0 and "%" not in screen


def process_on_terminal(*args, columns: int = 120, timeout: float = 600,
                        env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`dcptool ARGS` as a process of its own (its own Spark) with stderr on a
    pseudo-terminal: (exit status, stdout, what the terminal showed, escapes removed)."""
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    screen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    screen.extend(chunk)
                    continue
                # nothing to read although select said so: the terminal's end closed
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
                continue
            if proc.poll() is not None:
                break
        out = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return (proc.returncode, out.decode(errors="replace"),
            ANSI.sub("", bytes(screen).decode(errors="replace")))


@pytest.mark.timeout(900)  # a Spark of its own: its start-up on a busy machine
def test_export_draws_a_bar_of_records_that_ends_at_100(archive, tmp_path):
    rc, out, screen = process_on_terminal("export", archive, tmp_path / "out", "--format",
                                          "jsonl", "--master", "local[2]", "--partitions", "1",
                                          env={"DCPTOOL_PROGRESS_INTERVAL": "0",
                                               "DCPTOOL_FAULT": SEEN_BETWEEN})
    assert rc == 0, screen
    # the records of every backup's entries (headers and snapshot markers too) are read
    assert_counted(screen, "export", chain_records(archive))
    assert "exported 402 records" in out


@pytest.mark.timeout(900)  # the engine's start-up, when no test of this worker started it
def test_a_command_on_an_engine_counts_records(archive, shared_node, on_engine):
    # the engine's Python workers write the progress files; this process reads them
    rc, out, screen = process_on_terminal(
        "restore", archive, "--dry-run", "-c", f"{shared_node.host}:{shared_node.port}",
        "--partitions", "1",
        env={"DCPTOOL_PASSWORD": shared_node.password, "DCPTOOL_PROGRESS_INTERVAL": "0",
             "DCPTOOL_FAULT": SEEN_BETWEEN})
    assert rc == 0, screen
    assert_counted(screen, "dry run", chain_records(archive))


def test_merge_prune_and_remove_draw_a_bar_of_records_that_ends_at_100(shared_node, spark, tmp_path,
                                                               monkeypatch, quick_progress):
    from dcptool.archive import Archive

    path = tmp_path / "archive"
    for i in range(4):
        with opts_for(shared_node).connect() as conn:
            load(conn, {f"m::{i}::{j}": {"i": i} for j in range(100)}, VBS)
        run_backup(opts_for(shared_node), path, spark=spark, watermark=False)

    def records(ids) -> int:
        manifests = Archive.open(path).manifests()
        return sum(manifests[b]["totals"]["records"] for b in ids)

    # the oldest backup is merged into the next: the records of both are read
    ids = Archive.open(path).committed_ids()
    total = records(ids[:2])
    rc, out, screen = on_terminal(monkeypatch, "remove", path, "--backup", ids[0],
                                  "--partitions", "1")
    assert rc == 0, screen
    assert_counted(screen, "remove", total)
    total = records(Archive.open(path).committed_ids()[:2])
    rc, out, screen = on_terminal(monkeypatch, "prune", path, "--keep-last", "2",
                                  "--partitions", "1")
    assert rc == 0, screen
    assert_counted(screen, "prune", total)
    assert "keep 2 backups, remove 1 (0 deleted, 1 merged into 1 kept backup)" in out
    total = records(Archive.open(path).committed_ids())
    rc, out, screen = on_terminal(monkeypatch, "merge", path, "--partitions", "1")
    assert rc == 0, screen
    assert_counted(screen, "merge", total)
    assert "merged 2 backups" in out


def test_items_per_second_leaves_spark_startup_out(shared_node, spark, tmp_path, capsys,
                                                   monkeypatch):
    monkeypatch.setenv("DCPTOOL_PASSWORD", shared_node.password)
    target = f"{shared_node.host}:{shared_node.port}"
    archive = tmp_path / "archive"
    run_backup(opts_for(shared_node), archive, spark=spark, watermark=False)
    with opts_for(shared_node).connect() as conn:
        load(conn, {"q::3": {"again": 3}, "q::4": {"again": 4}}, VBS)
    rc, out, err = cli(capsys, "backup", archive, "-c", target, "--no-watermark", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["items_streamed"] == 2 and d["type"] == "incremental"
    work = d["seconds"] - d["spark_startup_seconds"]
    assert d["items_per_second"] == pytest.approx(2 / work, rel=0.05)
    # a 2-item incremental: a rate, never "0"
    with opts_for(shared_node).connect() as conn:
        load(conn, {"q::5": {"again": 5}, "q::6": {"again": 6}}, VBS)
    rc, out, err = cli(capsys, "backup", archive, "-c", target, "--no-watermark")
    assert rc == 0, err
    rate = re.search(r"items/s\s*│?\s*(\S+)", out).group(1)
    assert rate not in ("0", "-") and float(rate.replace(",", "")) > 0, out
    assert re.search(r"seconds\W+[\d.]+ s", out), out
    # restore: its duration and rate in the summary, Spark's start-up apart in the JSON
    rc, out, err = cli(capsys, "restore", archive, "--dry-run", "-c", target, "--json")
    d = json.loads(out)
    n = sum(d["restored"].values())
    assert n > 0 and d["spark_startup_seconds"] >= 0 and d["seconds"] > d["spark_startup_seconds"]
    assert d["items_per_second"] == pytest.approx(
        n / (d["seconds"] - d["spark_startup_seconds"]), rel=0.05)
    rc, out, err = cli(capsys, "restore", archive, "--dry-run", "-c", target)
    assert rc == 0, err
    assert re.search(rf"read {n:,} items in [\d.]+ s.*, [\d,.]+ items/s", out), out


def test_sizes_agree_in_info_verify_and_merge(shared_node, spark, tmp_path, capsys):
    path = tmp_path / "archive"
    for i in range(2):
        with opts_for(shared_node).connect() as conn:
            load(conn, {f"s::{i}::{j}": {"j": j, "pad": "x" * 200} for j in range(50)}, VBS)
        run_backup(opts_for(shared_node), path, spark=spark, watermark=False)
    info = json.loads(cli(capsys, "info", path, "--json")[1])
    sizes = {b["id"]: b["size_on_disk"] for b in info["backups"]}
    total = info["archive"]["size_on_disk"]
    assert total == sum(sizes.values()) > 0
    rc, out, _ = cli(capsys, "verify", path, "--json")
    assert rc == 0 and json.loads(out)["size_on_disk"] == total
    rc, out, _ = cli(capsys, "verify", path, "--checksums-only")
    assert f"OK: 2 backups ({human_bytes(total)})" in out
    rc, out, _ = cli(capsys, "info", path)
    assert human_bytes(total) in out and all(human_bytes(s) in out for s in sizes.values())
    rc, out, err = cli(capsys, "merge", path, "--json")
    assert rc == 0, err
    m = json.loads(out)
    assert m["size_before"] == total
    after = json.loads(cli(capsys, "info", path, "--json")[1])
    assert after["backups"][0]["size_on_disk"] == m["size_after"] > 0
    assert human_bytes(m["size_after"]) == human_bytes(after["archive"]["size_on_disk"])


def test_restore_names_created_collections_once(node_factory, spark, tmp_path, capsys,
                                                monkeypatch):
    from dcptool.client.connection import COLLECTION_FEATURES, Connection
    from dcptool.client.rest import RestClient
    from dcptool.protocol import Set, vbucket_of
    from dcptool.protocol.collections import doc_key

    src = node_factory("src", vbuckets=VBS)
    dst = node_factory("dst", vbuckets=VBS)
    rest = RestClient(src.host, src.rest_port, username=src.username, password=src.password,
                      bucket=src.bucket)
    rest.create_scope("inv")
    rest.create_collection("inv", "hotels")
    cid = rest.manifest().collection("inv", "hotels").uid
    with Connection.open(src.host, src.port, username=src.username, password=src.password,
                         bucket=src.bucket, features=COLLECTION_FEATURES) as conn:
        conn.request(Set(key=doc_key(cid, b"h1"), value=b'{"a":1}', vbucket=vbucket_of(b"h1", VBS),
                         datatype=1))
    path = tmp_path / "archive"
    run_backup(opts_for(src), path, spark=spark, watermark=False)
    monkeypatch.setenv("DCPTOOL_PASSWORD", dst.password)
    rc, out, err = cli(capsys, "restore", path, "-c", f"{dst.host}:{dst.port}")
    assert rc == 0, err
    assert (out + err).count("created on the target") == 1, out + err
    assert "inv.hotels" in err
    assert re.search(r"restored 1 item in [\d.]+ s", out), out


def _fits(out: str, width: int) -> bool:
    return all(len(line) <= width for line in out.splitlines())


def test_tables_fit_80_and_160_columns(shared_node, spark, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DCPTOOL_PASSWORD", shared_node.password)
    monkeypatch.setenv("DCPTOOL_ARCHIVE_PASSPHRASE", "a passphrase for the test")
    target = f"{shared_node.host}:{shared_node.port}"
    expires = int(time.time()) + 7200
    with opts_for(shared_node).connect() as conn:
        load(conn, {"t::exp": {"v": 1}}, VBS, expiry=expires)
    path = tmp_path / "archive"
    assert cli(capsys, "backup", path, "-c", target, "--encrypt")[0] == 0
    with opts_for(shared_node).connect() as conn:
        load(conn, {"t::exp": {"v": 2}}, VBS, expiry=expires)
    assert cli(capsys, "backup", path, "-c", target)[0] == 0
    ids = [b["id"] for b in json.loads(cli(capsys, "info", path, "--json")[1])["backups"]]
    wm = json.loads(cli(capsys, "watermark", "list", "-c", target, "--json")[1])
    names = [e["name"] for e in wm["entries"]]
    assert names and all(len(n) > 20 for n in names)
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(expires))
    for width in (80, 160):
        monkeypatch.setenv("COLUMNS", str(width))
        rc, out, err = cli(capsys, "info", path)
        assert rc == 0, err
        assert _fits(out, width), out
        for bid in ids:  # every id in full, every figure named
            assert bid in out
        for col in ("parent", "type", "state", "vbuckets", "mutations", "deletions",
                    "expirations", "rollbacks", "size on disk"):
            assert col in out, (width, out)
        rc, out, err = cli(capsys, "watermark", "list", "-c", target)
        assert rc == 0, err
        assert _fits(out, width) and all(n in out for n in names), out
        assert "…" not in out
        rc, out, err = cli(capsys, "examine", path, "t::exp")
        assert rc == 0, err
        assert _fits(out, width) and when in out and str(expires) not in out, out
        assert "…" not in out
        rc, out, err = cli(capsys, "key", "list", path)
        assert rc == 0, err
        # every column has a header (the last one, "current", had none)
        assert _fits(out, width) and "current" in out and "kdf" in out, out
    # at 160 columns info is one table: a header line naming every column; so is the
    # watermark list (the backups' watermarks: names and instances whole)
    assert re.search(r"backup\s.*parent\s.*size on disk", cli(capsys, "info", path)[1])
    out = cli(capsys, "watermark", "list", "-c", target)[1]
    assert re.search(r"name\s.*instance\s.*state\s.*vbuckets\s.*seqnos\s.*reported\s.*expires",
                     out), out
    monkeypatch.setenv("COLUMNS", "80")
    # at 80 a block per backup: each value on a line of its own, named
    out = cli(capsys, "info", path)[1]
    assert re.search(r"^\s+mutations:\s+[\d,]+$", out, re.M), out


def test_backup_prefix_and_plurals(shared_node, spark, tmp_path, capsys, monkeypatch):
    path = tmp_path / "archive"
    for i in range(2):
        with opts_for(shared_node).connect() as conn:
            load(conn, {"x::1": {"i": i}}, VBS)
        run_backup(opts_for(shared_node), path, spark=spark, watermark=False)
    ids = [b["id"] for b in json.loads(cli(capsys, "info", path, "--json")[1])["backups"]]
    common = os.path.commonprefix(ids)
    # an unambiguous beginning names the backup
    rc, out, err = cli(capsys, "examine", path, "x::1", "--backup", ids[0][:len(common) + 1],
                       "--json")
    assert rc == 0, err
    assert {v["backup"] for v in json.loads(out)["versions"]} == {ids[0]}
    # ambiguous, or no such backup: one line, usage status
    for given, what in ((common, "ambiguous"), ("1999", "no committed backup")):
        rc, out, err = cli(capsys, "examine", path, "x::1", "--backup", given)
        assert rc == 2 and what in err and len(err.strip().splitlines()) == 1, err
        rc, out, err = cli(capsys, "restore", path, "--dry-run", "--backup", given)
        assert rc == 2 and what in err and len(err.strip().splitlines()) == 1, err
    # plurals
    rc, out, err = cli(capsys, "prune", path, "--keep-last", "1", "--dry-run")
    assert rc == 0, err
    assert "keep 1 backup," in out and "1 backups" not in out
