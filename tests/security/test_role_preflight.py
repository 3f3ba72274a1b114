"""Every command that needs a privilege checks it before it starts (issue 24).

Users are made with `dcptool node user add` as a new user would, against a real node
process; each command runs as a real `python -m dcptool` process. A refused command exits
1 with exactly one line naming the user, the missing privilege and a role that grants it,
before Spark starts or anything is written (the archive is left as it was). The commands
a role allows still work. A role changed during a run (the node applies users.json
changes to open connections) ends the run with one line too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client.nodeutil import REPO, run_cli, write_docs
from dcptool.client import get_vbucket_seqnos
from dcptool.client.options import ConnOptions
from dcptool.client import privileges as P
from dcptool.node import access

VBS = 8
DOCS = 40
#: user -> role; each user's password is f"{user}-pw-4711"
USERS = {"bk": "backup", "rd": "reader", "rs": "restore", "wr": "writer", "sa": "scope_admin",
         # users whose role a test changes while its command runs
         "rs2": "restore", "bk2": "backup", "wr2": "writer"}


def pw(user: str) -> str:
    return f"{user}-pw-4711"


def add_user(data_dir: Path, user: str, role: str) -> None:
    r = run_cli("node", "user", "add", user, "--role", role, "--data", str(data_dir),
                env_extra={"DCPTOOL_PASSWORD": pw(user)})
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path_factory.mktemp("preflight") / "node", vbuckets=VBS)
    n.data_dir.mkdir(parents=True)
    for user, role in USERS.items():
        add_user(n.data_dir, user, role)
    n.start()
    write_docs(n, {b"doc%d" % i: b'{"n": %d}' % i for i in range(DOCS)})
    yield n
    n.stop()


def as_user(node, user: str, *args, timeout: float = 120, **env):
    """Run `dcptool ARGS` as `user` (connection options from the environment)."""
    return run_cli(*args, timeout=timeout, env_extra={
        "DCPTOOL_CLUSTER": f"couchbase://{node.host}:{node.port}", "DCPTOOL_USERNAME": user,
        "DCPTOOL_PASSWORD": pw(user), "DCPTOOL_ENGINE": "off", "DCPTOOL_BUCKET": "default",
        **env})


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `path`: (size, mtime_ns)."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*"))}


def refusal_line(r, user: str, privilege: str, role: str) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("dcptool: error: "), line
    assert f"user '{user}'" in line and privilege in line and role in line, line
    assert "Spark" not in r.stderr and "EACCESS" not in line
    return line


@pytest.fixture(scope="module")
def archive(node, tmp_path_factory):
    """A backup taken by the backup role (that it works is part of the matrix)."""
    a = tmp_path_factory.mktemp("preflight-archive") / "archive"
    r = as_user(node, "bk", "backup", str(a), "--no-progress", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mutations"] == DOCS and doc["watermark"]["registered"]
    return a


# -- the tables ---------------------------------------------------------------------------


def test_client_role_table_is_the_nodes():
    """The roles named in the error are the node's role table, seen from the privilege."""
    for name, roles in P.NODE_ROLES.items():
        priv = access.Privilege(name)
        assert set(roles) == {r for r, privs in access.ROLES.items() if priv in privs}, name
    assert P.granted_by(P.DCP_PRODUCER).startswith("the backup or admin role")
    assert P.granted_by(P.DCP_PRODUCER, P.WATERMARK_WRITE) == P.granted_by(P.DCP_PRODUCER)
    assert P.granted_by(P.NODE_MANAGEMENT) == "the admin role"


def test_probes_hold_for_an_admin_and_write_nothing(node):
    opts = ConnOptions(node.host, node.port, node.username, node.password, node.bucket)
    from client.nodeutil import connect

    with connect(node) as c:
        before = get_vbucket_seqnos(c)
    every = list(P.NODE_ROLES)
    P.check_privileges(opts, "do everything with", *every)
    with connect(node) as c:
        assert get_vbucket_seqnos(c) == before  # no probe wrote (no seqno moved)
    with pytest.raises(P.PrivilegeError) as got:
        P.check_privileges(ConnOptions(node.host, node.port, "rd", pw("rd"), node.bucket),
                           "do everything with", *every)
    assert got.value.username == "rd"
    assert set(got.value.privileges) == set(every) - {P.READ, P.META_READ}
    assert " Read," not in str(got.value)  # the reader holds Read
    assert "the admin role grants them" in str(got.value)


# -- refusals: one line, exit 1, nothing done -----------------------------------------------

#: (command args, {user: (missing privilege named, role named)})
REFUSED = {
    "backup": (("backup", "{archive}", "--no-progress"),
               {u: ("DcpProducer", "backup") for u in ("rd", "rs", "wr", "sa")}),
    "backup-new": (("backup", "{new}", "--no-progress", "--no-watermark"),
                   {"rd": ("DcpProducer", "backup")}),
    "restore": (("restore", "{archive}"),
                {u: ("MetaWrite", "restore") for u in ("bk", "rd", "wr", "sa")}),
    "verify": (("verify", "{archive}", "--against"),
               {u: ("DcpProducer", "backup") for u in ("rd", "rs", "wr")}),
    "tail": (("tail", "--from", "beginning", "--until-idle", "1"),
             {u: ("DcpProducer", "backup") for u in ("rd", "rs", "wr")}),
    "watermark-list": (("watermark", "list"),
                       {u: ("WatermarkRead", "backup") for u in ("rd", "rs", "wr")}),
    "watermark-remove": (("watermark", "remove", "--name", "nobody"),
                         {u: ("WatermarkWrite", "backup") for u in ("rd", "rs")}),
    "doc-get": (("doc", "get", "doc1"), {u: ("Read", "reader") for u in ("bk", "rs", "wr")}),
    "doc-set": (("doc", "set", "doc1", '{"changed": true}'),
                {u: ("Write", "writer") for u in ("bk", "rs", "rd")}),
    "doc-delete": (("doc", "delete", "doc2"), {u: ("Write", "writer") for u in ("rd", "bk")}),
    "doc-load": (("doc", "load", "--count", "5", "--prefix", "refused::"),
                 {"rs": ("Write", "writer")}),
    "cluster-status": (("cluster", "status"),
                       {u: ("NodeManagement", "admin") for u in ("bk", "rd", "rs", "wr")}),
}
CASES = [(cmd, user) for cmd, (_args, users) in REFUSED.items() for user in users]


@pytest.mark.parametrize("cmd,user", CASES, ids=[f"{c}-{u}" for c, u in CASES])
def test_refused_in_one_line_before_any_work(node, archive, tmp_path, cmd, user):
    args, users = REFUSED[cmd]
    privilege, role = users[user]
    new = tmp_path / "new-archive"
    args = [str(archive) if a == "{archive}" else str(new) if a == "{new}" else a for a in args]
    from client.nodeutil import connect

    with connect(node) as c:
        seqnos = get_vbucket_seqnos(c)
    files = tree(archive)
    r = as_user(node, user, *args)
    line = refusal_line(r, user, privilege, role)
    if privilege in P.SERVER_ROLES:
        assert "Couchbase Server: " in line
    assert r.stdout == ""
    assert tree(archive) == files  # no backup directory, no lock, no run log
    assert not new.exists()
    with connect(node) as c:
        assert get_vbucket_seqnos(c) == seqnos  # nothing written


def test_refusal_is_json_with_json(node, archive):
    r = as_user(node, "rd", "backup", str(archive), "--json")
    assert r.returncode == 1 and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    err = json.loads(lines[0])
    assert err["exit_code"] == 1
    assert "user 'rd'" in err["error"] and "DcpProducer" in err["error"]


# -- what each role may do still works ----------------------------------------------------

ALLOWED = [
    ("bk", ("tail", "--from", "beginning", "--until-idle", "1", "--keys-only")),
    ("bk", ("watermark", "list", "--json")),
    ("rd", ("doc", "get", "doc3")),
    ("wr", ("doc", "set", "written-by-wr", '{"ok": 1}')),
    ("wr", ("doc", "delete", "written-by-wr")),
    ("wr", ("doc", "load", "--count", "3", "--prefix", "wr::")),
    (None, ("cluster", "status", "--json")),
] + [(u, ("failover-log", "--json")) for u in ("bk", "rd", "rs", "wr", "sa")]


@pytest.mark.parametrize("user,args", ALLOWED, ids=[f"{a[0]}-{a[1]}-{u}" for u, a in ALLOWED])
def test_allowed_commands_work(node, user, args):
    if user is None:
        r = run_cli(*args, node=node)
    else:
        r = as_user(node, user, *args)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "error" not in r.stderr
    if args[0] == "tail":
        assert sum(1 for ln in r.stdout.splitlines() if "doc" in ln) >= DOCS


def test_restore_and_verify_work_for_their_roles(node, archive):
    r = as_user(node, "rs", "restore", str(archive), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert sum(d["restored"].values()) + sum(d["skipped"].values()) == DOCS
    assert sum(d["failed"].values()) == 0
    r = as_user(node, "bk", "verify", str(archive), "--against", "--json")
    assert r.returncode in (0, 1), r.stderr  # 1: the node changed since (allowed commands)
    assert "Traceback" not in r.stderr
    json.loads(r.stdout)


# -- a role changed during the run --------------------------------------------------------


def _set_role(node, user: str, role: str) -> None:
    """Change the user's role in the running node's users file (what `dcptool node user
    add` writes), without the start-up time of a CLI process."""
    from dcptool.node.auth import Users

    users = Users.load(node.data_dir)
    users.add(user, pw(user), [role])
    users.save()


def test_restore_losing_its_role_ends_in_one_line(node, archive):
    env = dict(os.environ, DCPTOOL_CLUSTER=f"couchbase://{node.host}:{node.port}",
               DCPTOOL_USERNAME="rs2", DCPTOOL_PASSWORD=pw("rs2"), DCPTOOL_ENGINE="off",
               NO_COLOR="1", COLUMNS="200")
    logs = archive / "logs"
    known = set(logs.iterdir())
    # --force-updates: every document is written (none is skipped as not newer)
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", "restore", str(archive),
                             "--force-updates"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        # the driver's checks are done (the privilege held) once the run log names the
        # collections; Spark starts after that, so the role changes before any write
        deadline = time.monotonic() + 60
        while True:
            new = [p for p in logs.iterdir() if p not in known]
            if new and "collections:" in new[0].read_text():
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        _set_role(node, "rs2", "reader")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "user 'rs2' lost the MetaWrite privilege" in lines[0]
    assert "restore or admin role" in lines[0]
    assert "failed: mutation" not in out + err


def test_tail_losing_its_role_ends_in_one_line(node, tmp_path):
    env = dict(os.environ, DCPTOOL_CLUSTER=f"couchbase://{node.host}:{node.port}",
               DCPTOOL_USERNAME="bk2", DCPTOOL_PASSWORD=pw("bk2"), NO_COLOR="1",
               COLUMNS="200")
    out_path = tmp_path / "tail.out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dcptool", "tail", "--from",
                                 "beginning", "--keys-only"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        while out_path.read_text().count("doc") < DOCS:  # streaming, caught up
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        add_user(node.data_dir, "bk2", "reader")  # as an administrator would
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "user 'bk2' lost the DcpProducer privilege" in lines[0]
    assert "backup or admin role" in lines[0]


def test_open_connection_gets_the_changed_role(node):
    """The node applies a changed users file to connections already open."""
    from dcptool.client import Connection
    from dcptool.protocol.constants import Status
    from dcptool.protocol.messages import Set
    from dcptool.protocol.vbucket import vbucket_of

    key = b"wr2-key"
    with Connection.open(node.host, node.port, username="wr2", password=pw("wr2"),
                         bucket=node.bucket) as c:
        def write() -> int:
            return c.request(Set(key=key, value=b"x", vbucket=vbucket_of(key, VBS))).status

        assert write() == Status.SUCCESS
        _set_role(node, "wr2", "reader")
        deadline = time.monotonic() + 10
        while write() != Status.EACCESS:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        _set_role(node, "wr2", "writer")
        while write() != Status.SUCCESS:
            assert time.monotonic() < deadline
            time.sleep(0.05)
