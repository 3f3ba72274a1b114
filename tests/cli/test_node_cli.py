"""`dcptool node start` and `dcptool node status` as a user runs them."""
from __future__ import annotations

import json
import os
import signal
import socket

import pytest
from cliutil import run_dcptool

from dcptool.protocol.constants import Opcode, Status

from node.mcbputil import Client, connect


def run(*args, env=None, timeout=60):
    e = dict(os.environ)
    e.pop("DCPTOOL_PASSWORD", None)
    if env:
        e.update(env)
    return run_dcptool(e, *args, timeout=timeout)  # forked from the warm zygote


def assert_one_error_line(proc, fragment: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dcptool: error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_start_without_any_password_is_one_clear_error(tmp_path):
    p = run("node", "start", "--data", str(tmp_path / "n"), "--port", "0")
    assert_one_error_line(p, "no users yet and no password")


@pytest.mark.parametrize("args,fragment", [
    (["--vbuckets", "0"], "--vbuckets"),
    (["--vbuckets", "5000"], "--vbuckets"),
    (["--port", "70000"], "--port"),
    (["--checkpoint-memory", "lots"], "--checkpoint-memory"),
    (["--bucket", "bad name!"], "--bucket"),
    (["--log-level", "chatty"], "--log-level"),
])
def test_bad_options_are_one_line(tmp_path, args, fragment):
    p = run("node", "start", "--data", str(tmp_path / "n"), "--port", "0", "--password", "pw", *args)
    assert_one_error_line(p, fragment)


def test_password_from_environment_and_reuse_of_stored_users(node_factory):
    node = node_factory(password=None, env={"DCPTOOL_PASSWORD": "from-env"})
    with Client(node.host, node.port) as c:
        assert c.auth_plain("Administrator", "from-env").status == Status.SUCCESS
    users = (node.data_dir / "users.json").read_text()
    assert "from-env" not in users
    node.stop()
    node.env = None
    node.start()  # no password at all: the stored users are used
    with Client(node.host, node.port) as c:
        assert c.auth_scram("Administrator", "from-env").status == Status.SUCCESS
        assert c.auth_plain("Administrator", "password").status == Status.AUTH_ERROR


def test_node_json_and_the_listening_line(node_factory):
    node = node_factory(vbuckets=8, bucket="travel")
    assert node.stdout_lines == [f"listening on 127.0.0.1:{node.port}",
                                 f"rest on http://127.0.0.1:{node.rest_port}"]
    doc = json.loads((node.data_dir / "node.json").read_text())
    assert doc["host"] == "127.0.0.1" and doc["port"] == node.port
    assert doc["pid"] == node.pid and doc["bucket"] == "travel" and doc["vbuckets"] == 8


def test_sigint_is_a_clean_stop_too(node_factory):
    node = node_factory(vbuckets=4)
    node.proc.send_signal(signal.SIGINT)
    assert node.proc.wait(30) == 0
    node._finish()
    node.start()
    with connect(node) as c:
        assert c.stats("warmup")["ep_warmup_clean_shutdown"] == "true"


def test_restart_with_other_vbucket_count_or_bucket_is_refused(node_factory):
    node = node_factory(vbuckets=4)
    node.stop()
    p = run("node", "start", "--data", str(node.data_dir), "--port", "0", "--vbuckets", "8")
    assert_one_error_line(p, "4 vbuckets")
    p = run("node", "start", "--data", str(node.data_dir), "--port", "0", "--vbuckets", "4",
            "--bucket", "other")
    assert_one_error_line(p, "bucket")


def test_port_in_use_is_one_line_and_leaves_the_data_clean(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as c:
        logs = [c.call(Opcode.GET_FAILOVER_LOG, vbucket=vb).value for vb in range(4)]
    node.stop()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        p = run("node", "start", "--data", str(node.data_dir), "--port", str(port),
                "--vbuckets", "4")
        assert_one_error_line(p, "cannot listen")
    finally:
        s.close()
    node.start()
    with connect(node) as c:
        assert [c.call(Opcode.GET_FAILOVER_LOG, vbucket=vb).value for vb in range(4)] == logs


def test_status_running_and_stopped(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as c:
        for i in range(20):
            c.set(b"st-%d" % i, b"v")
        seq = c.stats("vbucket-seqno")
    p = run("node", "status", "--data", str(node.data_dir), "--json",
            env={"DCPTOOL_PASSWORD": "password"})
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["running"] is True and info["port"] == node.port and info["source"] == "node"
    vbs = info["vbuckets_detail"]
    assert sorted(vbs) == ["0", "1", "2", "3"]
    for vb in range(4):
        d = vbs[str(vb)]
        assert d["high_seqno"] == int(seq[f"vb_{vb}:high_seqno"])
        assert d["failover_head"][0] == int(seq[f"vb_{vb}:uuid"])
    # without credentials: figures from disk
    p = run("node", "status", "--data", str(node.data_dir), "--json")
    info = json.loads(p.stdout)
    assert info["running"] is True and info["source"] == "disk"
    node.stop()
    p = run("node", "status", "--data", str(node.data_dir), "--json")
    info = json.loads(p.stdout)
    assert info["running"] is False
    for vb in range(4):
        d = info["vbuckets_detail"][str(vb)]
        assert d["high_seqno"] == d["persisted_seqno"] == int(seq[f"vb_{vb}:high_seqno"])
    p = run("node", "status", "--data", str(node.data_dir))
    assert p.returncode == 0 and "running: no" in p.stdout


def test_status_of_a_directory_without_a_node(tmp_path):
    p = run("node", "status", "--data", str(tmp_path))
    assert_one_error_line(p, "holds no dcptool node")
