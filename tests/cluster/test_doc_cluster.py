"""`dcptool doc` on a three-node cluster (one replica) reached through one member: every
key goes to its vbucket's active, reads come back through any other member, and a load
survives a failover or a move while it runs (nothing lost, nothing reported failed)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from client.nodeutil import REPO, run_cli
from clusterutil import addr, seqnos, start_nodes, status, stop_nodes, wait_until
from docutil import opts_for

from dcptool.client.routing import Router, RoutingError
from dcptool.client.topology import cluster_map, set_map
from dcptool.protocol import Get, Set, vbucket_of
from dcptool.protocol.constants import Status, VBucketState

VBS = 16


@pytest.fixture
def cluster3(tmp_path):
    """Nodes a, b, c as one cluster with one replica (`dcptool cluster create`)."""
    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=VBS)
    try:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), "-c", addr(c),
                    "--replicas", "1", node=a)
        assert r.returncode == 0, r.stderr
        yield nodes
    finally:
        stop_nodes(nodes)


def read_through(member, keys: list[str]) -> dict[str, tuple[int, bytes]]:
    """{key: (status, value)} for every key, read through `member`: the router started
    there sends each GET to the active its map names (pipelined, per member)."""
    opts = opts_for(member)
    out: dict[str, tuple[int, bytes]] = {}
    with Router(opts, opts.connect()) as router:
        n = router.vbuckets
        groups: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(router.node_of(vbucket_of(k.encode(), n)), []).append(i)
        for node, idxs in groups.items():
            conn = router.connection(node)
            for lo in range(0, len(idxs), 2000):
                part = idxs[lo:lo + 2000]
                buf = bytearray()
                for i in part:
                    k = keys[i].encode()
                    f = Get(key=k, vbucket=vbucket_of(k, n)).to_frame()
                    f.opaque = i
                    buf += f.encode()
                conn.send_bytes(buf)
                for _ in part:
                    fr = conn.recv_frame(timeout=60)
                    out[keys[fr.opaque]] = (fr.status, bytes(fr.value))
    return out


def active_counts(nodes) -> dict[str, int]:
    """{node name: items written to the vbuckets active there} (high seqnos)."""
    out = {}
    for name, n in nodes.items():
        st = status(n)["vbuckets"]
        out[name] = sum(v["high_seqno"] for v in st.values() if v["state"] == VBucketState.ACTIVE)
    return out


def assert_sample_docs(got: dict, prefix: str, count: int) -> None:
    missing = [k for k, (st, _v) in got.items() if st != Status.SUCCESS]
    assert not missing, f"{len(missing)} keys not readable, first {missing[:3]}"
    for i in range(count):
        doc = json.loads(got[f"{prefix}{i}"][1])
        assert doc["id"] == i and doc["name"] == f"{prefix}{i}"


def test_load_through_one_member_then_read_every_key_through_another(cluster3):
    a, b, c = cluster3["a"], cluster3["b"], cluster3["c"]
    r = run_cli("doc", "load", "--count", "3000", "--prefix", "u::", node=a)
    assert r.returncode == 0, r.stderr
    assert "loaded 3000 documents" in r.stdout and "3 members" in r.stdout
    # the writes went to the three actives, not all to the member named
    counts = active_counts(cluster3)
    assert sum(counts.values()) == 3000 and all(v > 0 for v in counts.values()), counts
    got = read_through(c, [f"u::{i}" for i in range(3000)])
    assert_sample_docs(got, "u::", 3000)
    # and with the CLI, one key of every vbucket, through B
    for vb in range(VBS):
        i = next(i for i in range(3000) if vbucket_of(f"u::{i}".encode(), VBS) == vb)
        r = run_cli("doc", "get", f"u::{i}", "--json", node=b)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["vbucket"] == vb and out["value"]["id"] == i


def test_set_get_delete_through_different_members(cluster3):
    a, b, c = cluster3["a"], cluster3["b"], cluster3["c"]
    keys = [f"k{i}" for i in range(12)]   # keys of vbuckets active on every member
    assert len({cluster_view_active(a, k) for k in keys}) == 3
    for k in keys:
        r = run_cli("doc", "set", k, json.dumps({"k": k}), node=a)
        assert r.returncode == 0, r.stderr
    for k in keys:
        r = run_cli("doc", "get", k, node=b)
        assert r.returncode == 0 and json.loads(r.stdout) == {"k": k}, r.stderr
    for k in keys[:6]:
        r = run_cli("doc", "delete", k, node=c)
        assert r.returncode == 0, r.stderr
    r = run_cli("doc", "get", keys[0], node=a)
    assert r.returncode == 1 and "no document 'k0'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    got = read_through(a, keys)
    assert [k for k in keys if got[k][0] == Status.SUCCESS] == keys[6:]


def cluster_view_active(member, key: str) -> str:
    with opts_for(member).connect() as conn:
        view = cluster_map(conn)
    return view.active_node(vbucket_of(key.encode(), len(view.vbmap)))


def test_stale_map_follows_the_map_a_not_my_vbucket_answer_carries(cluster3):
    """The router read the map before vbucket 0 moved from its active: the old active's
    NOT_MY_VBUCKET answer carries the new map, which the write follows without reading
    the map again from the members."""
    a, b, c = cluster3["a"], cluster3["b"], cluster3["c"]
    members = [a, b, c]
    opts = opts_for(b)
    router = Router(opts, opts.connect())
    with router:
        view = router.view
        old = view.vbmap[0][0]
        new = view.vbmap[0][1]          # its replica
        vbmap = [list(ch) for ch in view.vbmap]
        vbmap[0] = [new, old]
        names = [addr(m) for m in members]
        for i, m in enumerate(members):   # the new map, as `cluster move` would send it
            with opts_for(m).connect() as conn:
                set_map(conn, {"rev": view.map_rev + 1, "nodes": names, "this": i,
                               "replicas": 1, "vbmap": vbmap,
                               "auth": {"username": m.username, "password": m.password}})
        assert router.node_of(0) == names[old]
        key = next(f"s{i}" for i in range(1000) if vbucket_of(f"s{i}".encode(), VBS) == 0)
        rsp, node = router.request(0, Set(key=key.encode(), value=b'{"x": 1}', vbucket=0,
                                          datatype=1))
        assert rsp.status == Status.SUCCESS and node == names[new]
        assert router.maps_answered == 1 and router.maps_read == 0
    assert read_through(c, [key])[key] == (Status.SUCCESS, b'{"x": 1}')


def _loader(member, count: int, prefix: str) -> subprocess.Popen:
    import os

    env = dict(os.environ, DCPTOOL_CLUSTER=f"couchbase://{addr(member)}",
               DCPTOOL_USERNAME=member.username, DCPTOOL_PASSWORD=member.password,
               NO_COLOR="1")
    env.pop("DCPTOOL_BUCKET", None)
    return subprocess.Popen([sys.executable, "-m", "dcptool", "doc", "load", "--count",
                             str(count), "--prefix", prefix, "--timeout", "60", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL)


def _written(nodes) -> int:
    return sum(active_counts(nodes).values())


def test_failover_while_loading_loses_nothing_and_reports_nothing_failed(cluster3):
    """A load through B is paused mid-way (its window to A in flight), A is killed once
    its replicas have what it took, A is failed over, the load goes on: it reports every
    document written, and every key reads back through C."""
    a, b, c = cluster3["a"], cluster3["b"], cluster3["c"]
    count = 120_000
    loader = _loader(b, count, "f::")
    try:
        # under way, and A past its first windows: the loader sends a window (1,000 items,
        # a third for each member) only once every member answered the one before, so A
        # holding more than a window's worth means it acknowledged writes (the members
        # count below); on a loaded machine the first 3,000 could all be B's and C's
        wait_until(lambda: loader.poll() is not None or (
            _written(cluster3) > 3000 and active_counts({"a": a})["a"] > 1000),
            timeout=60, what="the load under way")
        assert loader.poll() is None, "the load ended before the failover"
        loader.send_signal(signal.SIGSTOP)
        # what A took (stable once the paused loader's window is applied) is on its replicas
        prev = None
        while True:
            now = {vb: s for vb, s in seqnos(a).items()}
            if now == prev:
                break
            prev = now
            time.sleep(0.3)
        st = status(a)["vbuckets"]
        on_a = {int(vb): d["high_seqno"] for vb, d in st.items()
                if d["state"] == VBucketState.ACTIVE}
        assert on_a and sum(on_a.values()) < count
        with opts_for(a).connect() as conn:
            view = cluster_map(conn)
        for vb, hi in on_a.items():
            replica = next(m for m in (b, c) if addr(m) == view.nodes[view.vbmap[vb][1]])
            wait_until(lambda: seqnos(replica).get(vb) == hi, timeout=60,
                       what=f"vbucket {vb} replicated to {hi}")
        a.kill()
        r = run_cli("cluster", "failover", "-c", addr(a), "--via", addr(b), "--json", node=b)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["promoted"]
        loader.send_signal(signal.SIGCONT)
        out, err = loader.communicate(timeout=300)
    finally:
        if loader.poll() is None:
            loader.send_signal(signal.SIGCONT)
            loader.kill()
            loader.wait()
    assert loader.returncode == 0, err
    done = json.loads(out)
    # the writes to A that were in flight went again to the promoted replicas
    assert done["count"] == count and done["members"] == 3 and done["resent"] > 0
    got = read_through(c, [f"f::{i}" for i in range(count)])
    assert_sample_docs(got, "f::", count)


def test_move_while_loading_loses_nothing(cluster3):
    """`cluster move` hands A's vbuckets to C while a load through A runs: the writes A
    refuses with NOT_MY_VBUCKET go to C, the load reports every document, and every key
    reads back through B."""
    a, b, c = cluster3["a"], cluster3["b"], cluster3["c"]
    count = 150_000
    loader = _loader(a, count, "m::")
    try:
        wait_until(lambda: loader.poll() is not None or _written(cluster3) > 3000,
                   timeout=60, what="the load under way")
        assert loader.poll() is None, "the load ended before the move"
        r = run_cli("cluster", "move", "-c", addr(b), "--vbuckets", "all", "--to", addr(c),
                    "--json", node=b, timeout=300)
        assert r.returncode == 0, r.stderr
        moved = json.loads(r.stdout)["moved"]
        assert moved
        out, err = loader.communicate(timeout=300)
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait()
    assert loader.returncode == 0, err
    done = json.loads(out)
    assert done["count"] == count and done["resent"] > 0   # A refused some: they went to C
    got = read_through(b, [f"m::{i}" for i in range(count)])
    assert {m["to"] for m in moved} == {addr(c)}
    assert_sample_docs(got, "m::", count)


def test_no_member_taking_a_key_ends_in_one_error_line(cluster3):
    """A is killed and nobody fails it over: a set of a key active on A retries for
    --timeout seconds, then fails with one line and no traceback."""
    a, b = cluster3["a"], cluster3["b"]
    key = next(f"d{i}" for i in range(1000) if cluster_view_active(b, f"d{i}") == addr(a))
    a.kill()
    t0 = time.monotonic()
    r = run_cli("doc", "set", key, '{"x": 1}', "--timeout", "1.5", node=b)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 30
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "found no member taking it within 1.5 s" in lines[0], r.stderr
    assert addr(a) in lines[0]


def test_router_gives_up_with_routing_error(cluster3):
    a, b = cluster3["a"], cluster3["b"]
    a.kill()
    opts = opts_for(b)
    with Router(opts, opts.connect(), reroute_seconds=0.5) as router:
        vb = next(v for v in range(VBS) if router.node_of(v) == addr(a))
        key = next(f"r{i}" for i in range(1000) if vbucket_of(f"r{i}".encode(), VBS) == vb)
        f = Set(key=key.encode(), value=b"1", vbucket=vb).to_frame()
        items = [(0, vb, f.encode())]
        with pytest.raises(RoutingError) as exc:
            router.write(items)
        assert exc.value.vbucket == vb and "1 writes found no member" in str(exc.value)
