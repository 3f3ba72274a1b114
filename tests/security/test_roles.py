"""Roles against a real node: users made offline with `dcptool node user add`, then each
role tried over the wire. Every opcode names its privilege; a missing one is EACCESS."""
from __future__ import annotations

import pytest

from client.nodeutil import run_cli, write_docs
from dcptool.client import (
    MUTATION, ZERO, Connection, DcpConsumer, get_failover_logs, get_vbucket_seqnos,
)
from dcptool.client.watermark import list_watermarks
from dcptool.node import access
from dcptool.node.commands import CHECKED_IN_HANDLER, COMMANDS
from dcptool.protocol.constants import DcpOpenFlag, Opcode, Status
from dcptool.protocol.messages import (
    CompactDb, DcpOpen, Get, Set, SetVbucket, SetWithMeta,
)
from dcptool.protocol.vbucket import vbucket_of

VBS = 8
#: user -> (role, password)
USERS = {"bk": ("backup", "bk-pw-31337"), "rd": ("reader", "rd-pw-4242"),
         "rs": ("restore", "rs-pw-7777"), "wr": ("writer", "wr-pw-9999")}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path_factory.mktemp("roles") / "node", vbuckets=VBS)
    n.data_dir.mkdir(parents=True)
    for user, (role, pw) in USERS.items():
        r = run_cli("node", "user", "add", user, "--role", role, "--data", str(n.data_dir),
                    env_extra={"DCPTOOL_PASSWORD": pw})
        assert r.returncode == 0, r.stderr
    n.start()  # --username Administrator --password ...: an admin
    write_docs(n, {b"doc%d" % i: b"v%d" % i for i in range(40)})
    yield n
    n.stop()


def login(node, user) -> Connection:
    return Connection.open(node.host, node.port, username=user, password=USERS[user][1],
                           bucket=node.bucket)


def _set(c, key=b"k1", value=b"x"):
    return c.request(Set(key=key, value=value, vbucket=vbucket_of(key, VBS))).status


def _get(c, key=b"doc1"):
    return c.request(Get(key=key, vbucket=vbucket_of(key, VBS))).status


def _dcp_open(c):
    return c.request(DcpOpen(name="roles-test", flags=int(DcpOpenFlag.PRODUCER))).status


def test_every_command_after_login_names_its_privilege():
    for op, cmd in COMMANDS.items():
        if cmd.pre_auth:
            continue
        priv = getattr(cmd.fn, "privilege", None)
        assert priv in set(access.Privilege) or op == Opcode.DCP_OPEN, hex(op)
    assert getattr(COMMANDS[Opcode.DCP_OPEN].fn, "privilege", CHECKED_IN_HANDLER) == CHECKED_IN_HANDLER
    assert access.ROLES["admin"] == frozenset(access.Privilege)


def test_backup_streams_dcp_but_cannot_write(node):
    with DcpConsumer.open(node.host, node.port, username="bk", password=USERS["bk"][1],
                          bucket=node.bucket) as consumer:
        with Connection.open(node.host, node.port, username="bk", password=USERS["bk"][1],
                             bucket=node.bucket) as c:
            high = get_vbucket_seqnos(c)
            logs = get_failover_logs(c, list(range(VBS)))
            assert sorted(logs) == list(range(VBS))
            assert isinstance(list_watermarks(c), dict)
            assert _set(c) == Status.EACCESS
            assert _get(c) == Status.EACCESS
            assert c.request(CompactDb(vbucket=0)).status == Status.EACCESS
        consumer.add_streams({vb: (ZERO, high[vb]) for vb in range(VBS)})
        events = [ev for batch in consumer.batches(tick=0.5) for ev in batch]
    assert sum(1 for ev in events if ev[0] == MUTATION) >= 40


def test_reader_reads_but_cannot_open_dcp_or_write(node):
    with login(node, "rd") as c:
        assert _get(c) == Status.SUCCESS
        assert _set(c) == Status.EACCESS
        assert _dcp_open(c) == Status.EACCESS
    with login(node, "rd") as c:  # consumer side too
        assert c.request(DcpOpen(name="x", flags=0)).status == Status.EACCESS


def test_restore_writes_with_meta_only(node):
    key = b"restored"
    vb = vbucket_of(key, VBS)
    with login(node, "rs") as c:
        rsp = c.request(SetWithMeta(key=key, value=b"from archive", vbucket=vb, rev_seqno=5,
                                    meta_cas=0x1234_5678_0000_0000))
        assert rsp.status == Status.SUCCESS
        assert _set(c) == Status.EACCESS
        assert _get(c) == Status.EACCESS
        assert _dcp_open(c) == Status.EACCESS
    with Connection.open(node.host, node.port, username=node.username, password=node.password,
                         bucket=node.bucket) as admin:
        got = admin.request(Get(key=key, vbucket=vb))
        assert got.status == Status.SUCCESS and bytes(got.value) == b"from archive"
        assert got.cas == 0x1234_5678_0000_0000


def test_writer_writes_but_cannot_read_or_manage(node):
    with login(node, "wr") as c:
        assert _set(c, b"w1") == Status.SUCCESS
        assert _get(c, b"w1") == Status.EACCESS
        assert c.request(SetVbucket(vbucket=0, state=1)).status == Status.EACCESS


def test_admin_keeps_everything(node):
    with Connection.open(node.host, node.port, username=node.username, password=node.password,
                         bucket=node.bucket) as c:
        assert _set(c, b"a1") == Status.SUCCESS and _get(c, b"a1") == Status.SUCCESS
        assert _dcp_open(c) == Status.SUCCESS
