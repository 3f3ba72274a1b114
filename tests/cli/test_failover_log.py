"""`dcptool failover-log` against a real node: after an unclean restart every vbucket has two
entries and --json matches the node's own failover logs (its STAT failovers); the table form;
one-line errors for a wrong password, a closed port and an unknown bucket."""
from __future__ import annotations

import socket

from client.nodeutil import json_lines, run_cli, stat_failovers, write_docs


def test_json_matches_node_after_unclean_restart(node_factory):
    node = node_factory("fl", vbuckets=8)
    write_docs(node, {b"k%d" % i: b"v" for i in range(50)})
    node.restart()  # clean: persisted, still one entry
    node.kill()     # unclean
    node.start()
    r = run_cli("failover-log", "--json", node=node)
    assert r.returncode == 0, r.stderr
    (doc,) = json_lines(r.stdout)
    own = stat_failovers(node)
    assert sorted(doc) == [str(vb) for vb in range(8)]
    for vb in range(8):
        entries = [(e["uuid"], e["seqno"]) for e in doc[str(vb)]]
        assert len(entries) == 2
        assert entries == own[vb]
        assert entries[0][1] >= entries[1][1]  # newest first


def test_table_and_vbucket_selection(shared_node):
    r = run_cli("failover-log", "--vbuckets", "0-2,7", node=shared_node)
    assert r.returncode == 0, r.stderr
    rows = [[c.strip() for c in ln.split("\u2502")[1:-1]] for ln in r.stdout.splitlines()
            if ln.startswith("\u2502")]
    assert [row[0] for row in rows if row[0]] == ["0", "1", "2", "7"]
    assert all(row[1].isdigit() for row in rows)
    own = stat_failovers(shared_node)
    uuid, seqno = own[7][0]
    assert f"0x{uuid:016x}" in r.stdout and str(uuid) in r.stdout
    rj = run_cli("failover-log", "--vbuckets", "3", "--json", node=shared_node)
    assert list(json_lines(rj.stdout)[0]) == ["3"]


def _one_error_line(r):
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert err[0].startswith("dcptool: error: ")
    assert "Traceback" not in r.stderr
    return err[0]


def test_wrong_password_closed_port_unknown_bucket(shared_node):
    n = shared_node
    line = _one_error_line(run_cli("failover-log", node=n,
                                   env_extra={"DCPTOOL_PASSWORD": "not-the-password"}))
    assert "authentication failed" in line and n.username in line
    assert "not-the-password" not in line

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    line = _one_error_line(run_cli("failover-log", "-c", f"127.0.0.1:{port}", node=n))
    assert f"127.0.0.1:{port}" in line and "refused" in line

    line = _one_error_line(run_cli("failover-log", "-b", "nosuchbucket", node=n))
    assert "nosuchbucket" in line and "not found" in line

    line = _one_error_line(run_cli("failover-log", "--vbuckets", "99", node=n))
    assert "vbucket 99" in line


def test_missing_password_without_terminal(shared_node):
    r = run_cli("failover-log", "-c", f"{shared_node.host}:{shared_node.port}")
    line = _one_error_line(r)
    assert "no password" in line


def test_tls_to_a_plain_node_is_one_line(shared_node):
    n = shared_node
    line = _one_error_line(run_cli("failover-log", "-c", f"couchbases://{n.host}:{n.port}",
                                   "--no-verify", node=n))
    assert "TLS" in line and f"{n.host}:{n.port}" in line
