"""Bucket-scoped roles and groups against a real node whose bucket is named `a`: a role
for bucket a (or `*`) works there, the same role for bucket b does not; a group's roles
are its members'; users.json files written before roles had buckets open unchanged."""
from __future__ import annotations

import json
import time

import pytest

from client.nodeutil import run_cli, write_docs
from dcptool.client import Connection
from dcptool.errors import DcptoolError
from dcptool.node.access import ROLES, Privilege, check_roles, privileges_of
from dcptool.node.auth import Users
from dcptool.protocol.constants import DcpOpenFlag, Status
from dcptool.protocol.messages import DcpOpen, Get, Set
from dcptool.protocol.vbucket import vbucket_of

VBS = 4
PW = "rbac-pw-31337"
#: user -> CLI arguments giving its roles and groups
USERS = {
    "ra": ("--role", "data_reader[a]"),
    "rb": ("--role", "data_reader[b]"),
    "rstar": ("--role", "data_reader[*]"),
    "wa": ("--role", "data_writer[a]"),
    "bka": ("--role", "data_backup[a]"),
    "bkb": ("--role", "data_backup[b]"),
    "full": ("--role", "bucket_full_access[*]"),
    "member": ("--group", "readers"),
    "mixed": ("--role", "data_writer[a]", "--group", "readers"),
}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path_factory.mktemp("rbac") / "node", vbuckets=VBS, bucket="a")
    n.data_dir.mkdir(parents=True)
    r = run_cli("node", "group", "add", "readers", "--role", "data_reader[a]",
                "--data", str(n.data_dir))
    assert r.returncode == 0, r.stderr
    for user, args in USERS.items():
        r = run_cli("node", "user", "add", user, *args, "--data", str(n.data_dir),
                    env_extra={"DCPTOOL_PASSWORD": PW})
        assert r.returncode == 0, r.stderr
    n.start()
    write_docs(n, {b"doc1": b"v1"})
    yield n
    n.stop()


def login(node, user, bucket="a") -> Connection:
    return Connection.open(node.host, node.port, username=user, password=PW, bucket=bucket)


def _get(c, key=b"doc1"):
    return c.request(Get(key=key, vbucket=vbucket_of(key, VBS))).status


def _set(c, key=b"k1"):
    return c.request(Set(key=key, value=b"x", vbucket=vbucket_of(key, VBS))).status


def _dcp_open(c):
    return c.request(DcpOpen(name="rbac-test", flags=int(DcpOpenFlag.PRODUCER))).status


def test_data_reader_of_bucket_a_reads_bucket_a_only(node):
    with login(node, "ra") as c:
        assert _get(c) == Status.SUCCESS
        assert _set(c) == Status.EACCESS


def test_a_role_on_another_bucket_cannot_use_bucket_a(node):
    with pytest.raises(DcptoolError, match="may not use bucket 'a'"):
        login(node, "rb")
    with login(node, "rb", bucket=None) as c:  # logged in, but bucket a is not its
        assert _get(c) != Status.SUCCESS
    with pytest.raises(DcptoolError, match="may not use bucket 'a'"):
        login(node, "bkb")


def test_star_is_every_bucket(node):
    with login(node, "rstar") as c:
        assert _get(c) == Status.SUCCESS
        assert _set(c) == Status.EACCESS
    with login(node, "full") as c:
        assert _get(c) == Status.SUCCESS
        assert _set(c) == Status.SUCCESS
        assert _dcp_open(c) == Status.SUCCESS


def test_data_writer_and_data_backup_of_bucket_a(node):
    with login(node, "wa") as c:
        assert _set(c) == Status.SUCCESS
        assert _get(c) == Status.EACCESS
    with login(node, "bka") as c:
        assert _dcp_open(c) == Status.SUCCESS
        assert _get(c) == Status.EACCESS


def test_groups_give_their_roles(node):
    with login(node, "member") as c:  # no role of its own
        assert _get(c) == Status.SUCCESS
        assert _set(c) == Status.EACCESS
    with login(node, "mixed") as c:  # its own writer role and its group's reader role
        assert _get(c) == Status.SUCCESS
        assert _set(c, b"k2") == Status.SUCCESS


def test_removing_a_group_takes_its_roles_from_open_connections(tmp_path, node_factory):
    n = node_factory("g", start=False, vbuckets=VBS, bucket="a")
    n.data_dir.mkdir(parents=True)
    run_cli("node", "group", "add", "g1", "--role", "data_reader[a]", "--data", str(n.data_dir))
    r = run_cli("node", "user", "add", "u", "--group", "g1", "--data", str(n.data_dir),
                env_extra={"DCPTOOL_PASSWORD": PW})
    assert r.returncode == 0, r.stderr
    n.start()
    write_docs(n, {b"doc1": b"v1"})
    with login(n, "u") as c:
        assert _get(c) == Status.SUCCESS
        r = run_cli("node", "group", "remove", "g1", "--data", str(n.data_dir))
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 10
        while _get(c) == Status.SUCCESS:
            assert time.monotonic() < deadline, "the group's removal never applied"
            time.sleep(0.05)
        assert _get(c) == Status.EACCESS
    n.stop()


def test_users_file_written_before_bucket_roles_opens_unchanged(tmp_path):
    """A version-1 file as dcptool wrote it: dcptool's roles, and an entry with none."""
    cred = {"salt": "c2FsdA==", "iterations": 4096, "stored_key": "AA==", "server_key": "AA=="}
    scram = {m: dict(cred) for m in ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1")}
    old = {"version": 1, "users": {
        "Administrator": {"scram": scram, "roles": ["admin"]},
        "bk": {"scram": scram, "roles": ["backup"]},
        "rw": {"scram": scram, "roles": ["reader", "writer"]},
        "sa": {"scram": scram, "roles": ["scope_admin"]},
        "ancient": {"scram": scram}}}
    (tmp_path / "users.json").write_text(json.dumps(old))
    users = Users.load(tmp_path)
    for bucket in (None, "a", "travel"):
        assert users.privileges("Administrator", bucket=bucket) == frozenset(Privilege)
        assert users.privileges("ancient", bucket=bucket) == frozenset(Privilege)
        assert users.privileges("bk", bucket=bucket) == ROLES["backup"]
        assert users.privileges("rw", bucket=bucket) == ROLES["reader"] | ROLES["writer"]
        assert users.privileges("sa", bucket=bucket) == ROLES["scope_admin"]
    assert users.groups == {}
    users.save()  # saved again without groups: still a version-1 file, the same users
    assert json.loads((tmp_path / "users.json").read_text()) == old


def test_privileges_by_bucket():
    assert privileges_of(["data_reader[a]"], "a") >= {Privilege.READ}
    assert privileges_of(["data_reader[a]"], "b") == frozenset()
    # without a bucket: find its way around only
    assert privileges_of(["data_reader[a]"]) == {Privilege.META_READ, Privilege.SIMPLE_STATS}
    assert Privilege.READ in privileges_of(["data_reader[*]"])
    assert Privilege.DCP_PRODUCER in privileges_of(["backup[a]"], "a")
    assert privileges_of(["backup[a]"], "b") == frozenset()
    # narrowed to a scope or collection: the node checks per bucket, so no data privilege
    assert Privilege.READ not in privileges_of(["data_reader[a:s:c]"], "a")
    assert privileges_of(["ro_admin"], "a") == privileges_of(["ro_admin"], None)
    assert Privilege.NODE_MANAGEMENT not in privileges_of(["bucket_admin[*]"], "a")


@pytest.mark.parametrize("bad", ["data_reader", "data_backup[]", "bucket_full_access",
                                 "admin[a]", "ro_admin[a]", "root", "data_reader[a:b:c:d]",
                                 "bucket_admin[a:s]", "data_reader[a"])
def test_unknown_or_bucketless_roles_are_refused_in_couchbase_words(bad):
    with pytest.raises(ValueError) as err:
        check_roles([bad])
    assert str(err.value) == ("Cannot assign roles to user because the following roles are "
                              "unknown, malformed or role parameters are undefined: "
                              f"[{bad}]")


def test_roles_are_canonical():
    assert check_roles(["data_reader[travel],DATA_BACKUP[travel]", "admin", "reader",
                        "scope_admin[t:inventory]", "data_writer[*]"]) == [
        "admin", "reader", "scope_admin[t:inventory]", "data_backup[travel]",
        "data_reader[travel]", "data_writer[*]"]
