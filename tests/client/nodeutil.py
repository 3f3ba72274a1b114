"""Helpers for end-to-end tests against the reference node: load documents with the client's
own Connection, and read back what the node holds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dcptool.client import Connection, get_failover_logs, get_vbucket_seqnos
from dcptool.protocol.messages import Delete, Set
from dcptool.protocol.vbucket import vbucket_of

REPO = Path(__file__).resolve().parent.parent.parent


def connect(node, **kw) -> Connection:
    return Connection.open(node.host, node.port, username=node.username, password=node.password,
                           bucket=node.bucket, **kw)


def send_sets(conn, sets) -> None:
    """Send the (key, Set message) pairs of `sets` pipelined on `conn` and check that every
    answer is SUCCESS."""
    ops = []
    out = bytearray()
    for key, msg in sets:
        frame = msg.to_frame()
        frame.opaque = conn.next_opaque()
        ops.append((key, frame.opaque))
        out += frame.encode()
    conn.send_bytes(out)
    for key, op in ops:
        rsp = conn.wait_response(op)
        assert rsp.status == 0, f"SET {key!r} failed with status {rsp.status:#x}"


def write_docs(node, docs: dict[bytes, bytes], *, flags: int = 0, expiry: int = 0) -> dict[bytes, int]:
    """SET every document (pipelined); return {key: vbucket}."""
    vbs = {key: vbucket_of(key, node.vbuckets) for key in docs}
    with connect(node) as c:
        send_sets(c, ((key, Set(key=key, value=value, vbucket=vbs[key], flags=flags,
                                expiry=expiry, datatype=1 if value[:1] in (b"{", b"[") else 0))
                      for key, value in docs.items()))
    return vbs


def delete_docs(node, keys) -> None:
    with connect(node) as c:
        for key in keys:
            rsp = c.request(Delete(key=key, vbucket=vbucket_of(key, node.vbuckets)))
            assert rsp.status == 0, f"DELETE {key!r} failed with status {rsp.status:#x}"


def node_state(node) -> tuple[dict[int, int], dict[int, tuple]]:
    """(high seqnos, failover logs) as the node reports them."""
    with connect(node) as c:
        seqnos = get_vbucket_seqnos(c)
        logs = get_failover_logs(c, sorted(seqnos))
    return seqnos, logs


def run_cli(*args, env_extra: dict | None = None, timeout: float = 60, input: str | None = None,
            node=None) -> subprocess.CompletedProcess:
    """Run `python -m dcptool ARGS` as a real process; with `node`, connection options come
    from the environment (the password never on the command line)."""
    env = dict(os.environ)
    for k in ("DCPTOOL_CLUSTER", "DCPTOOL_USERNAME", "DCPTOOL_PASSWORD", "DCPTOOL_BUCKET"):
        env.pop(k, None)
    if node is not None:
        env.update(DCPTOOL_CLUSTER=f"couchbase://{node.host}:{node.port}",
                   DCPTOOL_USERNAME=node.username, DCPTOOL_PASSWORD=node.password)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    env.update(env_extra or {})
    import zygote

    return zygote.run(args, env=env, cwd=REPO, input=input, timeout=timeout)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def stat_failovers(node) -> dict[int, list[tuple[int, int]]]:
    """The failover logs as the node's STAT `failovers` group reports them (an independent
    path from GET_FAILOVER_LOG): {vb: [(uuid, seqno), ...]} newest first."""
    from dcptool.protocol.messages import Stat

    with connect(node) as c:
        frame = Stat(group="failovers").to_frame()
        frame.opaque = c.next_opaque()
        c.send_bytes(frame.encode())
        stats = {}
        while True:
            rsp = c.wait_response(frame.opaque)
            assert rsp.status == 0, f"STAT failovers failed: {rsp.status:#x}"
            if not rsp.key:
                break
            stats[rsp.key.decode()] = rsp.value.decode()
    logs: dict[int, dict[int, list]] = {}
    for name, value in stats.items():
        parts = name.split(":")
        if len(parts) != 3 or not parts[0].startswith("vb_"):
            continue
        vb, idx, field = int(parts[0][3:]), int(parts[1]), parts[2]
        entry = logs.setdefault(vb, {}).setdefault(idx, [0, 0])
        if field == "id":
            entry[0] = int(value)
        elif field == "seq":
            entry[1] = int(value)
    return {vb: [tuple(e[i]) for i in sorted(e)] for vb, e in logs.items()}
