"""`dcptool tail` against a real node process: everything from the beginning in seqno order,
--state resumes without repeats, rollback after the node branched while the tail was away,
NOOPs keep an idle tail connected, Ctrl-C saves state and exits 0, --keys-only/--filter/--count,
and one-line errors."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from client.nodeutil import REPO, json_lines, node_state, run_cli, write_docs

from dcptool.protocol import vbucket_of


def records(lines, kind="mutation"):
    return [d for d in lines if d["type"] == kind]


def test_from_beginning_prints_every_document_in_seqno_order(shared_node):
    n = shared_node
    docs = {b"tb-%03d" % i: b'{"n": %d}' % i for i in range(120)}
    write_docs(n, docs, flags=0x02000006)
    seqnos, _ = node_state(n)
    r = run_cli("tail", "--from", "beginning", "--until-idle", "2", "--json", node=n)
    assert r.returncode == 0, r.stderr
    out = json_lines(r.stdout)
    muts = records(out)
    by_key = {d["key"]: d for d in muts}
    for key, value in docs.items():
        d = by_key[key.decode()]
        assert d["value"] == value.decode()
        assert d["vbucket"] == vbucket_of(key, n.vbuckets)
        assert d["flags"] == 0x02000006 and d["datatype"] == 1
        assert d["rev_seqno"] >= 1 and d["cas"] > 0
    for vb in range(n.vbuckets):
        seqs = [d["seqno"] for d in muts if d["vbucket"] == vb]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        if seqs:
            assert seqs[-1] <= seqnos[vb]
    assert records(out, "snapshot"), "snapshot markers appear as events"


def test_state_resume_prints_only_changes_in_between(shared_node, tmp_path):
    n = shared_node
    state = tmp_path / "tail.state"
    write_docs(n, {b"st-%03d" % i: b"one" for i in range(30)})
    r1 = run_cli("tail", "--from", "beginning", "--state", str(state), "--until-idle", "1.5",
                 "--json", node=n)
    assert r1.returncode == 0, r1.stderr
    saved = json.loads(state.read_text())
    assert saved["format"] == "dcptool-session" and len(saved["vbuckets"]) == n.vbuckets
    seen1 = {(d["vbucket"], d["seqno"]) for d in records(json_lines(r1.stdout))}

    between = {b"st-%03d" % i: b"two" for i in range(0, 30, 3)}
    between.update({b"st-new-%d" % i: b"three" for i in range(7)})
    write_docs(n, between)
    r2 = run_cli("tail", "--state", str(state), "--until-idle", "1.5", "--json", node=n)
    assert r2.returncode == 0, r2.stderr
    muts2 = records(json_lines(r2.stdout))
    assert sorted(d["key"].encode() for d in muts2) == sorted(between)
    assert not seen1 & {(d["vbucket"], d["seqno"]) for d in muts2}

    r3 = run_cli("tail", "--state", str(state), "--until-idle", "1", "--json", node=n)
    assert r3.returncode == 0 and records(json_lines(r3.stdout)) == []


def test_resumed_tail_rolls_back_and_continues_without_gaps(node_factory, tmp_path):
    node = node_factory("tail-rb", vbuckets=4, extra_args=("--flush-interval", "60"))
    state = tmp_path / "rb.state"
    write_docs(node, {b"a-%02d" % i: b"A" for i in range(30)})
    node.restart()  # clean stop persists everything: no new failover entry
    persisted, _ = node_state(node)
    r = run_cli("tail", "--from", "beginning", "--state", str(state), "--until-idle", "1",
                "--json", node=node)
    assert r.returncode == 0, r.stderr
    write_docs(node, {b"b-%02d" % i: b"B" for i in range(30)})  # in memory only
    r = run_cli("tail", "--state", str(state), "--until-idle", "1", "--json", node=node)
    assert len(records(json_lines(r.stdout))) == 30
    node.kill()   # unclean: the b- documents are lost, every vbucket branches
    node.start()
    c_docs = {b"c-%02d" % i: b"C" for i in range(30)}
    write_docs(node, c_docs)
    seqnos, logs = node_state(node)
    assert all(len(log) == 2 for log in logs.values())

    r = run_cli("tail", "--state", str(state), "--until-idle", "1.5", "--json", node=node)
    assert r.returncode == 0, r.stderr
    out = json_lines(r.stdout)
    rollbacks = {d["vbucket"]: d for d in out if d["type"] == "rollback"}
    assert set(rollbacks) == set(range(4))
    for vb, d in rollbacks.items():
        assert d["rollback_seqno"] == persisted[vb] == d["to_seqno"]
        assert d["from_seqno"] > d["to_seqno"]
    for vb in range(4):
        evs = [d for d in out if d["vbucket"] == vb]
        after = evs[[e["type"] for e in evs].index("rollback") + 1:]
        seqs = [d["seqno"] for d in after if d["type"] == "mutation"]
        assert seqs == list(range(persisted[vb] + 1, seqs[-1] + 1 if seqs else persisted[vb] + 1))
        assert (seqs[-1] if seqs else persisted[vb]) == seqnos[vb]
    assert {d["key"] for d in records(out)} == {k.decode() for k in c_docs}
    saved = json.loads(state.read_text())["vbuckets"]
    for vb in range(4):
        assert saved[str(vb)]["seqno"] == seqnos[vb]
        assert [tuple(e) for e in saved[str(vb)]["failover_log"]] == list(logs[vb])


def _spawn_tail(node, *args):
    env = dict(os.environ, DCPTOOL_CLUSTER=f"{node.host}:{node.port}",
               DCPTOOL_USERNAME=node.username, DCPTOOL_PASSWORD=node.password, NO_COLOR="1")
    return subprocess.Popen([sys.executable, "-m", "dcptool", "tail", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def _key_in(vbs, n, prefix):
    return next(k for k in (b"%s-%d" % (prefix, i) for i in range(10000))
                if vbucket_of(k, n.vbuckets) in vbs)


def _wait_streaming(node, proc, vbuckets: int, noop_interval: float, timeout: float = 60) -> None:
    """Until a DCP producer of `node` with that noop interval streams `vbuckets` vbuckets
    (a tail started from now that is not streaming yet would miss a write)."""
    from node.mcbputil import connect

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stderr.read()
        with connect(node) as c:
            st = c.stats("dcp")
        for k, v in st.items():
            if k.endswith(":num_streams") and v == str(vbuckets):
                interval = st.get(k.rsplit(":", 1)[0] + ":noop_interval", "")
                try:
                    if float(interval) == noop_interval:
                        return
                except ValueError:
                    pass
        assert time.monotonic() < deadline, f"the tail streams no vbucket after {timeout}s: {st}"
        time.sleep(0.1)


def test_idle_tail_answers_noops_and_stays_connected(shared_node):
    n = shared_node
    p = _spawn_tail(n, "--vbuckets", "0-3", "--noop-interval", "1", "--count", "1", "--json", "-v")
    try:
        _wait_streaming(n, p, 4, 1.0)
        time.sleep(3.5)  # three noop intervals without a change
        assert p.poll() is None, p.stderr.read()
        key = _key_in(range(4), n, b"noop")
        write_docs(n, {key: b"after-idle"})
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    (doc,) = [d for d in json_lines(out) if d["type"] == "mutation"]
    assert doc["key"] == key.decode() and doc["value"] == "after-idle"
    answered = int(err.split(" noops answered")[0].rsplit(" ", 1)[1])
    assert answered >= 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_saves_state_and_exits_0(shared_node, tmp_path, sig):
    n = shared_node
    state = tmp_path / "sigint.state"
    write_docs(n, {b"ci-%02d" % i: b"v" for i in range(10)})
    p = _spawn_tail(n, "--from", "beginning", "--state", str(state), "--json")
    try:
        deadline = time.monotonic() + 20
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err
    seqnos, _ = node_state(n)
    saved = json.loads(state.read_text())["vbuckets"]
    assert {int(vb): v["seqno"] for vb, v in saved.items()} == seqnos
    printed = {(d["vbucket"], d["seqno"]) for d in records(json_lines(out))}
    r = run_cli("tail", "--state", str(state), "--until-idle", "1", "--json", node=n)
    assert not printed & {(d["vbucket"], d["seqno"]) for d in records(json_lines(r.stdout))}


def test_keys_only_filter_count(shared_node, tmp_path):
    n = shared_node
    write_docs(n, {b"user::%d" % i: b"secret-%d" % i for i in range(20)})
    write_docs(n, {b"order::%d" % i: b"o" for i in range(20)})
    r = run_cli("tail", "--from", "beginning", "--keys-only", "--filter", "^user::1", "--json",
                "--until-idle", "1.5", node=n)
    assert r.returncode == 0, r.stderr
    muts = records(json_lines(r.stdout))
    assert {d["key"] for d in muts} >= {"user::1"} | {f"user::1{i}" for i in range(10)}
    assert all(d["key"].startswith("user::1") and "value" not in d for d in muts)
    state = tmp_path / "count.state"
    r = run_cli("tail", "--from", "beginning", "--count", "5", "--state", str(state), "--json",
                node=n)
    assert r.returncode == 0 and len(records(json_lines(r.stdout))) == 5
    first = {(d["vbucket"], d["seqno"]) for d in records(json_lines(r.stdout))}
    r = run_cli("tail", "--state", str(state), "--count", "5", "--json", node=n)
    second = {(d["vbucket"], d["seqno"]) for d in records(json_lines(r.stdout))}
    assert len(second) == 5 and not first & second


def test_readable_view(shared_node):
    n = shared_node
    write_docs(n, {b"view-1": b'{"hello": "world"}'})
    r = run_cli("tail", "--from", "beginning", "--filter", "^view-1$", "--until-idle", "1", node=n)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if "view-1" in ln]
    assert "mutation" in line and '{"hello": "world"}' in line


def test_errors_are_one_line(shared_node, tmp_path):
    n = shared_node
    r = run_cli("tail", "-b", "nosuch", "--until-idle", "1", node=n)
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("dcptool: error: ") and "nosuch" in r.stderr
    r = run_cli("tail", "--from", str(tmp_path / "missing.state"), node=n)
    assert r.returncode != 0 and "does not exist" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli("tail", "--filter", "(", node=n)
    assert r.returncode == 2 and "regular expression" in r.stderr
