"""`dcptool node status`: is the node of a directory running, and where are its vbuckets?

Runs outside the node. The per-vbucket figures come from the node itself over the wire
when credentials are at hand (STAT vbucket-seqno and failovers), otherwise from the
database, which the flusher keeps within one flush interval of the node's memory.
"""
from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path
from typing import Any

from dcptool.errors import DcptoolError
from dcptool.procs import pid_alive

from .datalock import LOCK_FILE, NODE_FILE, holder, is_locked
from .storage import SEQNO_MASK, row_id


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def disk_view(data_dir: Path) -> dict[int, dict[str, Any]]:
    path = Path(data_dir) / "data.sqlite3"
    if not path.exists():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        db.execute("PRAGMA busy_timeout=5000")
        out = {}
        for vb, state, failover, persisted, purge in db.execute(
                "SELECT vb, state, failover, persisted_seqno, purge_seqno FROM vbucket_meta ORDER BY vb"):
            row = db.execute("SELECT max(id) FROM items WHERE id >= ? AND id < ?",
                             (row_id(vb, 0), row_id(vb + 1, 0))).fetchone()
            high = max(persisted, (row[0] & SEQNO_MASK) if row[0] is not None else 0)
            log = json.loads(failover)
            out[vb] = {"state": state, "high_seqno": high, "persisted_seqno": persisted,
                       "purge_seqno": purge, "failover_head": list(log[0]) if log else None,
                       "failover_entries": len(log)}
        return out
    except sqlite3.Error as exc:
        raise DcptoolError(f"cannot read {path}: {exc}") from None
    finally:
        db.close()


def hwt_view(data_dir: Path, now: float | None = None) -> list[dict[str, Any]]:
    """The high watermark table as stored (the node writes it through on every change)."""
    import time

    from .hwt import HwtEntry
    from .storage import HWT_COLUMNS

    path = Path(data_dir) / "data.sqlite3"
    if not path.exists():
        return []
    now = time.time() if now is None else now
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        db.execute("PRAGMA busy_timeout=5000")
        try:
            rows = db.execute(f"SELECT {HWT_COLUMNS} FROM hwt ORDER BY name, instance").fetchall()
        except sqlite3.OperationalError:  # a database from before the table existed
            return []
        out = []
        for row in rows:
            d = HwtEntry.from_row(row).describe(now)
            d["vbuckets"] = len(d["vbuckets"])
            d.pop("meta", None)
            out.append(d)
        return out
    except sqlite3.Error as exc:
        raise DcptoolError(f"cannot read {path}: {exc}") from None
    finally:
        db.close()


#: general STAT figures `node status` shows under "logins": (JSON name, STAT name)
LOGIN_STATS = (
    ("kv_failed", "auth_errors"),
    ("rest_failed", "rest_auth_errors"),
    ("delayed", "auth_delayed"),
    ("unauthenticated_connections", "curr_unauth_conns"),
    ("unauthenticated_closed", "conns_closed_unauth_limit"),
    ("auth_timeouts", "auth_timeouts"),
    ("pre_auth_frames_too_big", "conns_closed_pre_auth_e2big"),
)


def live_view(host: str, port: int, bucket: str, username: str, password: str,
              timeout: float = 5.0,
              logins: dict[str, int] | None = None) -> dict[int, dict[str, Any]]:
    """Ask the running node for its vbucket-seqno and failovers stats (and, into
    `logins`, the login figures of its general stats)."""
    from dcptool.protocol import FrameDecoder, Opcode, encode_frame

    sock = socket.create_connection((host, port), timeout=timeout)
    dec = FrameDecoder()
    opaque = 0

    def call(opcode: int, key: bytes = b"", value: bytes = b"") -> list:
        nonlocal opaque
        opaque += 1
        sock.sendall(encode_frame(0x80, opcode, 0, opaque, key=key, value=value))
        frames = []
        while True:
            f = dec.next_frame()
            if f is None:
                data = sock.recv(65536)
                if not data:
                    raise DcptoolError(f"{host}:{port} closed the connection")
                dec.feed(data)
                continue
            frames.append(f)
            if f.specific != 0 or opcode != Opcode.STAT or not f.key:
                return frames

    try:
        r = call(Opcode.SASL_AUTH, b"PLAIN", b"\x00" + username.encode() + b"\x00" + password.encode())
        if r[-1].specific != 0:
            raise DcptoolError(f"{host}:{port} refused the credentials of {username!r}")
        call(Opcode.HELLO, b"dcptool-status", b"\x00\x07")
        if call(Opcode.SELECT_BUCKET, bucket.encode())[-1].specific != 0:
            raise DcptoolError(f"{host}:{port} has no bucket {bucket!r}")
        stats: dict[str, str] = {}
        if logins is not None:
            general = {}
            for f in call(Opcode.STAT):
                if f.key:
                    general[f.key.decode()] = f.value.decode()
            for name, stat in LOGIN_STATS:
                if stat in general:
                    logins[name] = int(general[stat])
        for group in (b"vbucket-seqno", b"failovers", b"vbucket"):
            for f in call(Opcode.STAT, group):
                if f.key:
                    stats[f.key.decode()] = f.value.decode()
    finally:
        sock.close()
    out: dict[int, dict[str, Any]] = {}
    states = {"active": 1, "replica": 2, "pending": 3, "dead": 4}
    for k, v in stats.items():
        if ":" not in k:
            vbid = int(k[3:])
            out.setdefault(vbid, {})["state"] = states.get(v, 4)
            continue
        vbpart, _, name = k.partition(":")
        vbid = int(vbpart[3:])
        d = out.setdefault(vbid, {})
        if name in ("high_seqno", "last_persisted_seqno", "purge_seqno"):
            d[{"last_persisted_seqno": "persisted_seqno"}.get(name, name)] = int(v)
        elif name == "num_entries":
            d["failover_entries"] = int(v)
        elif name == "0:id":
            d.setdefault("failover_head", [0, 0])[0] = int(v)
        elif name == "0:seq":
            d.setdefault("failover_head", [0, 0])[1] = int(v)
    return out


def node_status(data_dir: Path, *, username: str | None = None,
                password: str | None = None) -> dict[str, Any]:
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DcptoolError(f"{data_dir} is not a directory")
    info: dict[str, Any] = {"data_dir": str(data_dir), "running": False}
    nf = data_dir / NODE_FILE
    node: dict[str, Any] = {}
    if nf.exists():
        try:
            node = json.loads(nf.read_text())
        except (OSError, ValueError):
            node = {}
    if not node and not (data_dir / "data.sqlite3").exists():
        raise DcptoolError(f"{data_dir} holds no dcptool node",
                           hint="start one with 'dcptool node start --data DIR'")
    if node:
        info.update({k: node.get(k) for k in ("host", "port", "pid", "bucket", "vbuckets")})
    if (data_dir / LOCK_FILE).exists():
        # the node's lock says who runs here: node.json counts only when it is the holder's
        info["running"] = is_locked(data_dir)
        held_by = holder(data_dir).get("pid") if info["running"] else None
        if held_by is not None and node.get("pid") != held_by:
            info.update({"pid": held_by, "host": None, "port": None})
            node = {}
        info["running"] = info["running"] and bool(node) and _port_open(node["host"],
                                                                        node["port"])
    elif node:
        pid = node.get("pid")
        if (isinstance(pid, int) and pid_alive(pid, cmdline_contains=b"dcptool")
                and _port_open(node["host"], node["port"])):
            info["running"] = True
    vbs = None
    source = "disk"
    if info["running"] and password:
        logins: dict[str, int] = {}
        try:
            vbs = live_view(node["host"], node["port"], node.get("bucket", "default"),
                            username or "Administrator", password, logins=logins)
            source = "node"
            info["logins"] = logins
        except (OSError, DcptoolError) as exc:
            info["live_error"] = str(exc)
    if vbs is None:
        vbs = disk_view(data_dir)
    info["source"] = source
    info["vbuckets_detail"] = {str(k): v for k, v in sorted(vbs.items())}
    info["hwt"] = hwt_view(data_dir)
    return info
