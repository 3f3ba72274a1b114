"""DCPTOOL_FAULT parsing, and ResumingConsumer against a real node behind a cutting proxy."""
from __future__ import annotations

import errno
from dataclasses import replace

import pytest
from docutil import load, opts_for
from faultutil import Proxy, docs
from nodeprocutil import NodeProcess

from dcptool import faults
from dcptool.client.consumer import ResumingConsumer
from dcptool.client.errors import ConnectionClosed
from dcptool.client.events import MUTATION, SNAPSHOT, STREAM_END, STREAM_OPEN
from dcptool.client.position import ZERO
from dcptool.client.session import SessionConfig


@pytest.fixture
def fault_env(monkeypatch):
    monkeypatch.setattr(faults, "_totals", {})

    def set_(spec: str) -> None:
        monkeypatch.setenv("DCPTOOL_FAULT", spec)

    return set_


def test_no_fault_without_the_variable(monkeypatch):
    monkeypatch.delenv("DCPTOOL_FAULT", raising=False)
    faults.fault_point("frame", fd=-1, data=b"x" * 10**6)
    faults.fault_point("rename", path="manifest.json")


def test_several_specs_and_enospc_after_bytes(fault_env):
    fault_env("stall-after-vbuckets:99, enospc-after-bytes:10")
    faults.fault_point("vbucket-closed", 3)  # below 99: no stall
    faults.fault_point("rename", path="x/manifest.json")  # not asked for
    faults.fault_point("frame", fd=-1, data=b"12345")
    faults.fault_point("frame", fd=-1, data=b"12345")  # 10 bytes: not above the limit
    with pytest.raises(OSError) as exc:
        faults.fault_point("frame", fd=-1, data=b"1")
    assert exc.value.errno == errno.ENOSPC


def test_kill_points_only_fire_where_they_belong(fault_env):
    # these would SIGKILL the test run if they fired
    fault_env("kill-before-manifest-rename,kill-mid-stream:1000")
    faults.fault_point("rename", path="x/vb-0001.done.json")
    faults.fault_point("events", 999)
    faults.fault_point("frame", fd=-1, data=b"abc")


def test_resuming_consumer_resumes_after_cuts_and_gives_up_on_a_dead_node(tmp_path):
    node = NodeProcess(tmp_path / "node", vbuckets=1).start()
    try:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(3000, size=200), 1)
        config = SessionConfig(name="resume-test", consistent=True)
        with Proxy(node.host, node.port, cuts=3, cut_min=30_000, cut_max=120_000,
                   seed=7) as proxy:
            popts = replace(opts, host=proxy.host, port=proxy.port)
            c = ResumingConsumer(lambda: popts.consumer(config), delay=0.01)
            c.add_streams({0: (ZERO, 3000)})
            items: list[int] = []
            opens = []
            snapshot_ends = {0}
            for events in c.batches(tick=0.5):
                for ev in events:
                    if ev[0] == MUTATION:
                        items.append(ev[2])
                    elif ev[0] == SNAPSHOT:
                        snapshot_ends.add(ev[3])
                    elif ev[0] == STREAM_OPEN:
                        opens.append(ev[3].seqno)
                        # what came after the position it resumes from comes again
                        items = [s for s in items if s <= ev[3].seqno]
                    elif ev[0] == STREAM_END:
                        assert ev[2] == 0
            c.close()
        assert len(proxy.cut_at) == 3 and c.reconnects == 3
        assert len(opens) == 4 and opens[0] == 0 and opens == sorted(opens)
        # each stream resumed from the end of a snapshot it had completely, never inside one
        assert set(opens) <= snapshot_ends, (opens, sorted(snapshot_ends)[:20])
        assert items == list(range(1, 3001))

        # a node that is gone: bounded attempts, then a clear error
        c = ResumingConsumer(lambda: opts_for(node).consumer(config), attempts=3, delay=0.01)
        c.add_streams({0: (ZERO, 10**6)})  # streams on, past the end of the data
        batches = c.batches(tick=0.2)
        next(batches)
        node.kill()
        with pytest.raises(ConnectionClosed, match="could not resume after 3 attempts"):
            for _ in batches:
                pass
        c.close()
    finally:
        node.stop()
