"""One node per data directory: a second start on a running node's directory is refused.

Before the lock, two nodes on one directory both ran, each assigned seqno 1 in vbucket 0,
and after a restart a write one of them had acknowledged was gone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from dcptool.node.datalock import DataDirInUse, DataDirLock, is_locked
from dcptool.protocol import vbucket_of
from dcptool.protocol.constants import Opcode, Status

from .mcbputil import connect


def start_second(data_dir, *extra):
    env = dict(os.environ, DCPTOOL_PASSWORD="password")
    return subprocess.run([sys.executable, "-m", "dcptool", "node", "start", "--data",
                           str(data_dir), "--port", "0", "--vbuckets", "4", *extra],
                          capture_output=True, text=True, env=env, timeout=60)


def key_in_vb0(i: int) -> bytes:
    n = 0
    while True:
        key = b"lock-%d-%d" % (i, n)
        if vbucket_of(key, 4) == 0:
            return key
        n += 1


def test_second_start_is_refused_and_no_acknowledged_write_is_lost(node_factory):
    first = node_factory(vbuckets=4)
    k1, k2 = key_in_vb0(1), key_in_vb0(2)
    with connect(first) as c:
        assert c.set(k1, b'{"n": 1}').status == Status.SUCCESS
    second = start_second(first.data_dir)
    assert second.returncode == 3, second
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert lines[0].startswith("dcptool: error: ")
    assert f"pid {first.pid}" in lines[0] and f":{first.port}" in lines[0], lines[0]
    assert second.stdout == ""  # it never listened
    # the running node still owns node.json, and status names it
    assert json.loads((first.data_dir / "node.json").read_text())["pid"] == first.pid
    p = subprocess.run([sys.executable, "-m", "dcptool", "node", "status", "--data",
                        str(first.data_dir), "--json"], capture_output=True, text=True,
                       timeout=60)
    info = json.loads(p.stdout)
    assert info["running"] is True and info["pid"] == first.pid and info["port"] == first.port
    with connect(first) as c:
        assert c.set(k2, b'{"n": 2}').status == Status.SUCCESS
        seqno = int(c.stats("vbucket-seqno")["vb_0:high_seqno"])
    assert seqno == 2
    first.stop()
    first.start()
    with connect(first) as c:
        assert c.call(Opcode.GET, key=k1, vbucket=0).value == b'{"n": 1}'
        assert c.call(Opcode.GET, key=k2, vbucket=0).value == b'{"n": 2}'
        assert int(c.stats("vbucket-seqno")["vb_0:high_seqno"]) == 2


def test_a_killed_node_leaves_no_lock_behind(node_factory):
    node = node_factory(vbuckets=4)
    assert is_locked(node.data_dir)
    node.kill()
    assert not is_locked(node.data_dir)
    node.start()  # no stale lock to break by hand
    assert is_locked(node.data_dir)


def test_lock_in_process(tmp_path):
    with DataDirLock(tmp_path):
        assert is_locked(tmp_path)
        try:
            DataDirLock(tmp_path).acquire()
        except DataDirInUse as exc:
            assert f"pid {os.getpid()}" in exc.message and exc.exit_code == 3
        else:
            raise AssertionError("a second lock on the same directory was granted")
    assert not is_locked(tmp_path)
