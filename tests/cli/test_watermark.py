"""`dcptool watermark`, `tail --watermark` and `info -c` against real node processes."""
from __future__ import annotations

import json
import re

import pytest
from client.nodeutil import connect, delete_docs, json_lines, run_cli, write_docs
from docutil import opts_for
from docutil import wait_persisted as _wait_persisted

from dcptool.client.watermark import get_stats, list_watermarks
from dcptool.protocol.messages import CompactDb


def wait_persisted(node) -> None:
    _wait_persisted(opts_for(node))


def one_error_line(r, fragment: str) -> str:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dcptool: error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture
def node(node_factory):
    return node_factory(vbuckets=16, extra_args=("--purge-age", "0"))


def test_register_list_remove(node, tmp_path):
    seqnos = tmp_path / "seqnos.json"
    seqnos.write_text(json.dumps({"0": 5, "1": 7, "15": 0}))
    r = run_cli("watermark", "register", "--name", "my-app", "--seqnos", str(seqnos),
                "--ttl", "2h", "--meta", '{"owner": "ops"}', node=node)
    assert r.returncode == 0, r.stderr
    assert "registered my-app/default: 3 vbuckets, seqnos 0..7" in r.stdout
    r = run_cli("watermark", "register", "--name", "my-app", "--instance", "b",
                "--seqnos", str(seqnos), "--json", node=node)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["replaced"] is False and doc["instance"] == "b"
    # registering again renews (same name and instance)
    r = run_cli("watermark", "register", "--name", "my-app", "--seqnos", str(seqnos), node=node)
    assert r.returncode == 0 and "renewed my-app/default" in r.stdout

    r = run_cli("watermark", "list", "--json", node=node)
    assert r.returncode == 0, r.stderr
    table = json.loads(r.stdout)
    rows = {(e["name"], e["instance"]): e for e in table["entries"]}
    assert set(rows) == {("my-app", "default"), ("my-app", "b")}
    e = rows[("my-app", "default")]
    assert e["state"] == "ok" and e["vbuckets"] == {"0": 5, "1": 7, "15": 0}
    assert (e["lowest_seqno"], e["highest_seqno"]) == (0, 7)
    assert 7 * 86400 - 5 < e["expires_at"] - e["reported_at"] <= 7 * 86400  # the default TTL
    assert rows[("my-app", "b")]["meta"] == {}

    r = run_cli("watermark", "list", node=node)
    assert r.returncode == 0, r.stderr
    for word in ("name", "instance", "state", "seqnos", "0..7", "reported", "expires", "in 1w",
                 "my-app"):
        assert word in r.stdout
    assert "purge age 0s" in r.stdout

    r = run_cli("watermark", "remove", "--name", "my-app", "--instance", "b", node=node)
    assert r.returncode == 0 and "removed my-app/b" in r.stdout
    r = run_cli("watermark", "remove", "--name", "my-app", "--json", node=node)
    assert r.returncode == 0 and json.loads(r.stdout) == {
        "removed": [{"name": "my-app", "instance": "default"}]}
    one_error_line(run_cli("watermark", "remove", "--name", "my-app", node=node),
                   "no high watermark registered as my-app")
    r = run_cli("watermark", "list", node=node)
    assert r.returncode == 0 and "no high watermarks registered" in r.stdout


def test_list_shows_how_far_each_holds_the_purger_back(node):
    keys = [b"h-%02d" % i for i in range(40)]
    write_docs(node, {k: b"{}" for k in keys})
    delete_docs(node, keys)
    wait_persisted(node)
    with connect(node) as c:
        from dcptool.client.watermark import register_watermark
        register_watermark(c, "slow", "1", {vb: 0 for vb in range(16)}, ttl=600)
        table = list_watermarks(c)
    holding = table["entries"][0]["holding"]
    assert sum(h["tombstones"] for h in holding.values()) == 40
    r = run_cli("watermark", "list", node=node)
    assert r.returncode == 0, r.stderr
    assert "40 tombstones in" in r.stdout
    assert "per vbucket: what each watermark holds back" in r.stdout


def test_list_fits_80_columns_and_is_one_table_at_160(node, tmp_path):
    """A backup's watermark (its archive's name, the archive's uuid as instance) and a
    tail's, both holding tombstones back: at 160 columns `watermark list` is a table with
    every column and every name whole; at 80 a block per watermark, nothing cut."""
    keys = [b"w-%02d" % i for i in range(8)]
    write_docs(node, {k: b"{}" for k in keys})
    delete_docs(node, keys)
    wait_persisted(node)
    seqnos = tmp_path / "seqnos.json"
    seqnos.write_text(json.dumps({str(vb): 0 for vb in range(16)}))
    rows = [("dcptool-backup:orders-nightly-archive", "8d6c1a40-3f41-4c6e-9f0e-3c8a1f6c2b77"),
            ("dcptool-tail:changes.state", "5f0c2a9e7d13b4a6")]
    for name, instance in rows:
        r = run_cli("watermark", "register", "--name", name, "--instance", instance,
                    "--seqnos", str(seqnos), node=node)
        assert r.returncode == 0, r.stderr
    columns = ("name", "instance", "state", "vbuckets", "seqnos", "reported", "expires",
               "holding back")
    per_vbucket = ("name", "instance", "vb", "watermark", "purge seqno", "tombstones",
                   "up to seqno", "purgeable for")

    def listed(width: int) -> str:
        r = run_cli("watermark", "list", node=node, env_extra={"COLUMNS": str(width)})
        assert r.returncode == 0, r.stderr
        assert all(len(line) <= width for line in r.stdout.splitlines()), r.stdout
        assert "…" not in r.stdout
        for name, instance in rows:  # whole, on one line each time they are shown
            assert name in r.stdout and instance in r.stdout, r.stdout
        return r.stdout

    wide = listed(160)
    # one header line naming every column, in order, for each of the two tables
    for names in (columns, per_vbucket):
        assert re.search(r"┃\s*" + r"\s*┃\s*".join(map(re.escape, names)) + r"\s*┃", wide), wide
    for name, instance in rows:
        assert re.search(rf"│ {re.escape(name)}\s*│ {instance}\s*│ ok\s*│\s*16 │\s*0\.\.0 │"
                         r"\s*\d+s ago │\s*in 1w │ \d+ tombstones in", wide), wide
    narrow = listed(80)
    # a block per watermark: its name, then every value named on a line of its own
    for name, instance in rows:
        assert f"name {name}\n  instance:     {instance}\n" in narrow, narrow
    for label in ("state:", "vbuckets:", "seqnos:", "reported:", "expires:", "holding back:"):
        assert len(re.findall(rf"^  {label}", narrow, re.M)) == 2, narrow
    assert "┃" not in narrow.split("per vbucket")[0]


def test_user_errors_are_one_line(node, tmp_path):
    one_error_line(run_cli("watermark", "register", "--name", "x", node=node),
                   "exactly one of --seqnos")
    f = tmp_path / "s.json"
    f.write_text('{"0": 1}')
    one_error_line(run_cli("watermark", "register", "--seqnos", str(f), node=node),
                   "--name is required")
    one_error_line(run_cli("watermark", "register", "--name", "x", "--seqnos", str(f),
                           "--ttl", "soon", node=node), "--ttl")
    one_error_line(run_cli("watermark", "register", "--name", "x", "--seqnos", str(f),
                           "--ttl", "0", node=node), "--ttl must be positive")
    one_error_line(run_cli("watermark", "register", "--name", "x", "--seqnos",
                           str(tmp_path / "missing.json"), node=node), "cannot read")
    f.write_text("[1, 2]")
    one_error_line(run_cli("watermark", "register", "--name", "x", "--seqnos", str(f),
                           node=node), "JSON object")
    f.write_text('{"0": -3}')
    one_error_line(run_cli("watermark", "register", "--name", "x", "--seqnos", str(f),
                           node=node), "vbucket 0 needs a seqno")
    f.write_text('{"99": 3}')
    one_error_line(run_cli("watermark", "register", "--name", "x", "--seqnos", str(f),
                           node=node), "vbucket '99' is not one of this bucket's 16 vbuckets")
    f.write_text('{"0": 3}')
    one_error_line(run_cli("watermark", "register", "--name", "x", "--seqnos", str(f),
                           "--meta", "[]", node=node), "--meta must be a JSON object")
    one_error_line(run_cli("watermark", "remove", node=node), "--name is required")
    line = one_error_line(run_cli("watermark", "list", node=node,
                                  env_extra={"DCPTOOL_PASSWORD": "wrong-secret"}), "")
    assert "wrong-secret" not in line
    one_error_line(run_cli("tail", "--watermark", node=node), "--watermark needs --state")


def test_a_node_without_the_extension(node_factory, tmp_path):
    bare = node_factory("bare", vbuckets=16, extra_args=("--no-hwt",))
    one_error_line(run_cli("watermark", "list", node=bare), "has no high watermark table support")
    state = tmp_path / "t.state"
    r = run_cli("tail", "--from", "beginning", "--state", str(state), "--watermark",
                "--watermark-interval", "0.2", "--until-idle", "1.5", "--json", node=bare)
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "no high watermark table support" in ln]
    assert len(notes) == 1, r.stderr
    assert state.exists()


def test_tail_registers_what_its_state_file_holds_at_most_once_per_interval(node, tmp_path):
    write_docs(node, {b"t-%02d" % i: b"{}" for i in range(30)})
    state = tmp_path / "tail.state"
    r = run_cli("tail", "--from", "beginning", "--state", str(state), "--watermark",
                "--watermark-interval", "600", "--until-idle", "1.5", "--json", node=node)
    assert r.returncode == 0, r.stderr
    with connect(node) as c:
        stats = get_stats(c)
        table = list_watermarks(c)
    assert stats["ep_hwt_registrations"] == "1"  # once, at the start, within the interval
    [row] = table["entries"]
    assert row["name"] == "dcptool-tail:tail.state" and row["state"] == "ok"
    assert row["meta"]["state"] == str(state.absolute())
    # the first registration is the start: the state file's positions then
    assert set(row["vbuckets"].values()) == {0}

    # a short interval registers again as the tail goes, with what the state file holds
    write_docs(node, {b"u-%02d" % i: b"{}" for i in range(10)})
    r = run_cli("tail", "--state", str(state), "--watermark", "--watermark-interval", "0.3",
                "--until-idle", "2", "--json", node=node)
    assert r.returncode == 0, r.stderr
    saved = json.loads(state.read_text())["vbuckets"]
    with connect(node) as c:
        stats = get_stats(c)
        [row] = list_watermarks(c)["entries"]
    n = int(stats["ep_hwt_registrations"])
    assert 3 <= n <= 2 + 2.5 / 0.3 + 1
    assert row["vbuckets"] == {vb: p["seqno"] for vb, p in saved.items()}
    assert len(json_lines(r.stdout)) > 0


def test_info_warns_when_the_node_purged_what_the_archive_needs(node, tmp_path, spark):
    from dcptool.pipeline.backup import run_backup

    write_docs(node, {b"i-%02d" % i: b"{}" for i in range(60)})
    archive = tmp_path / "archive"
    run_backup(opts_for(node), archive, spark=spark)          # registers its watermark
    r = run_cli("info", str(archive), "-c", f"{node.host}:{node.port}", node=node)
    assert r.returncode == 0, r.stderr
    assert "high watermark dcptool-backup:archive ok" in r.stdout
    assert "warning" not in r.stderr

    # without the watermark the purger takes deletions the archive has not seen
    r = run_cli("watermark", "remove", "--archive", str(archive), node=node)
    assert r.returncode == 0, r.stderr
    delete_docs(node, [b"i-%02d" % i for i in range(60)])
    wait_persisted(node)
    with connect(node) as c:
        for vb in range(16):
            assert c.request(CompactDb(vbucket=vb)).status == 0
    r = run_cli("info", str(archive), "-c", f"{node.host}:{node.port}", node=node)
    assert r.returncode == 0, r.stderr
    assert "no high watermark registered for this archive" in r.stdout
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("dcptool: warning:")]
    assert len(warn) == 1 and "from seqno 0" in warn[0]
    assert "watermark register --archive" in r.stderr
    r = run_cli("info", str(archive), "-c", f"{node.host}:{node.port}", "--json", node=node)
    check = json.loads(r.stdout)["node_check"]
    assert check["watermark"]["state"] is None and len(check["warnings"]) >= 8
    w = check["warnings"][0]
    assert 0 < w["backed_up_seqno"] < w["purge_seqno"]

    # register --archive by hand puts the row back
    r = run_cli("watermark", "register", "--archive", str(archive), "--ttl", "1d", node=node)
    assert r.returncode == 0, r.stderr
    assert "registered dcptool-backup:archive/" in r.stdout
    assert "already purged deletions above this watermark" in r.stderr
    # plain info needs no node, even with DCPTOOL_CLUSTER set
    r = run_cli("info", str(archive), "--json", env_extra={"DCPTOOL_CLUSTER": "127.0.0.1:1"})
    assert r.returncode == 0, r.stderr
    assert "node_check" not in json.loads(r.stdout)
