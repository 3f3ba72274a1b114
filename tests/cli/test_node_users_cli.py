"""`dcptool node user add|remove|list` as real processes: passwords from DCPTOOL_PASSWORD or
--password-file (never the command line), stored as salted SCRAM credentials only, never
printed; a user made offline can log in to a node started afterwards with its role."""
from __future__ import annotations

import json
import os
import stat

from client.nodeutil import json_lines, run_cli
from dcptool.client import Connection
from dcptool.protocol.constants import Status
from dcptool.protocol.messages import Set
from dcptool.protocol.vbucket import vbucket_of

SECRET = "correct-horse-battery-1234"
SECRET2 = "another-Secret-5678"


def _one_error_line(r) -> str:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_user_round_trip_and_no_secret_anywhere(tmp_path, node_factory):
    d = tmp_path / "node"
    outputs = []

    def cli(*args, **kw):
        r = run_cli("node", "user", *args, "--data", str(d), **kw)
        outputs.append(r.stdout + r.stderr)
        return r

    r = cli("add", "alice", "--role", "backup", env_extra={"DCPTOOL_PASSWORD": SECRET})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "added user alice (backup)"
    pwfile = tmp_path / "pw.txt"
    pwfile.write_text(SECRET2 + "\n")
    r = cli("add", "bob", "--role", "writer", "-r", "reader", "--password-file", str(pwfile))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "added user bob (reader, writer)"
    r = cli("list", "--json")
    assert r.returncode == 0, r.stderr
    assert json_lines(r.stdout) == [{"users": [
        {"username": "alice", "roles": ["backup"], "groups": []},
        {"username": "bob", "roles": ["reader", "writer"], "groups": []}]}]
    r = cli("list")
    assert r.stdout.splitlines() == ["alice\tbackup", "bob\treader,writer"]

    users_file = d / "users.json"
    assert stat.S_IMODE(os.stat(users_file).st_mode) == 0o600
    raw = users_file.read_text()
    doc = json.loads(raw)
    for secret in (SECRET, SECRET2):
        assert secret not in raw
        assert secret.encode().hex() not in raw
    for name in ("alice", "bob"):
        entry = doc["users"][name]
        assert set(entry) == {"scram", "roles", "password_change_date"}
        assert set(entry["scram"]) == {"SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"}
        assert set(entry["scram"]["SCRAM-SHA512"]) == {"salt", "iterations", "stored_key",
                                                       "server_key"}
    # salted: the same password twice gives different credentials
    cli("add", "carol", "--role", "reader", env_extra={"DCPTOOL_PASSWORD": SECRET})
    doc = json.loads(users_file.read_text())
    assert doc["users"]["carol"]["scram"] != doc["users"]["alice"]["scram"]

    # the users work on a node started afterwards, with their roles
    node = node_factory("n", start=False, vbuckets=4)
    node.data_dir = d
    node.start()
    key = b"k"
    vb = vbucket_of(key, 4)
    with Connection.open(node.host, node.port, username="bob", password=SECRET2) as c:
        assert c.request(Set(key=key, value=b"v", vbucket=vb)).status == Status.SUCCESS
    with Connection.open(node.host, node.port, username="alice", password=SECRET) as c:
        assert c.request(Set(key=key, value=b"v", vbucket=vb)).status == Status.EACCESS
    node.stop()
    doc = json.loads(users_file.read_text())
    assert doc["users"]["Administrator"]["roles"] == ["admin"]

    r = cli("add", "carol", "--role", "restore", "--json", env_extra={"DCPTOOL_PASSWORD": SECRET})
    assert json_lines(r.stdout) == [{"username": "carol", "roles": ["restore"], "groups": [],
                                     "created": False}]
    r = cli("remove", "bob", "--json")
    assert json_lines(r.stdout) == [{"username": "bob", "removed": True}]
    assert "no user bob" in _one_error_line(cli("remove", "bob"))
    r = cli("list", "--json")
    assert json_lines(r.stdout)[0]["users"] == [
        {"username": "Administrator", "roles": ["admin"], "groups": []},
        {"username": "alice", "roles": ["backup"], "groups": []},
        {"username": "carol", "roles": ["restore"], "groups": []}]
    for out in outputs:
        assert SECRET not in out and SECRET2 not in out
    log = (d / "logs" / "node.log").read_text() + node.stderr()
    assert SECRET not in log and SECRET2 not in log


def test_user_add_refusals_are_one_line(tmp_path):
    d = str(tmp_path / "node")
    line = _one_error_line(run_cli("node", "user", "add", "x", "--role", "root", "--data", d,
                                   env_extra={"DCPTOOL_PASSWORD": "pw"}))
    # Couchbase Server's wording
    assert "roles are unknown, malformed or role parameters are undefined: [root]" in line
    line = _one_error_line(run_cli("node", "user", "add", "x", "--role", "reader", "--data", d))
    assert "no password" in line
    line = _one_error_line(run_cli("node", "user", "add", "x", "--role", "reader", "--data", d,
                                   "--password-file", str(tmp_path / "missing")))
    assert "--password-file" in line
    r = run_cli("node", "user", "add", "x", "--role", "reader", "--data", d, "--password", "pw")
    assert r.returncode != 0 and "Traceback" not in r.stderr  # no such option
    line = _one_error_line(run_cli("node", "user", "list", "--data", str(tmp_path / "none")))
    assert "not a node directory" in line


def test_start_keeps_roles_of_an_existing_user(tmp_path, node_factory):
    d = tmp_path / "node"
    r = run_cli("node", "user", "add", "ops", "--role", "reader", "--data", str(d),
                env_extra={"DCPTOOL_PASSWORD": SECRET})
    assert r.returncode == 0, r.stderr
    node = node_factory("n", start=False, vbuckets=4, username="ops", password=SECRET2)
    node.data_dir = d
    node.start()
    with Connection.open(node.host, node.port, username="ops", password=SECRET2) as c:
        key = b"k"
        assert c.request(Set(key=key, value=b"v", vbucket=vbucket_of(key, 4))).status \
            == Status.EACCESS
    node.stop()
    doc = json.loads((d / "users.json").read_text())
    assert doc["users"]["ops"]["roles"] == ["reader"]


def test_bucket_roles_and_groups(tmp_path, node_factory):
    d = tmp_path / "node"

    def cli(*args, **kw):
        return run_cli("node", *args, "--data", str(d), **kw)

    r = cli("group", "add", "readers", "--role", "data_reader[a]", "--description", "Read a")
    assert (r.returncode, r.stdout.strip()) == (0, "added group readers (data_reader[a])")
    r = cli("user", "add", "bk", "--role", "data_backup[travel],ro_admin", "--group", "readers",
            env_extra={"DCPTOOL_PASSWORD": SECRET})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "added user bk (ro_admin, data_backup[travel], group readers)"
    r = cli("user", "add", "only", "-g", "readers", "--json",
            env_extra={"DCPTOOL_PASSWORD": SECRET})
    assert json_lines(r.stdout) == [{"username": "only", "roles": [], "groups": ["readers"],
                                     "created": True}]
    r = cli("user", "list")
    assert r.stdout.splitlines() == ["bk\tro_admin,data_backup[travel]\tgroups: readers",
                                     "only\t\tgroups: readers"]
    r = cli("group", "list", "--json")
    assert json_lines(r.stdout) == [{"groups": [{"group": "readers", "roles": ["data_reader[a]"],
                                                 "description": "Read a",
                                                 "members": ["bk", "only"]}]}]
    assert stat.S_IMODE(os.stat(d / "users.json").st_mode) == 0o600

    # the group's role works on a node whose bucket is a
    node = node_factory("n", start=False, vbuckets=4, bucket="a")
    node.data_dir = d
    node.start()
    key = b"k"
    with Connection.open(node.host, node.port, username="only", password=SECRET,
                         bucket="a") as c:
        assert c.request(Set(key=key, value=b"v", vbucket=vbucket_of(key, 4))).status \
            == Status.EACCESS  # a reader
    node.stop()

    # refusals: one line each, Couchbase's words where it has them
    for args, words in (
            (("user", "add", "x", "--role", "data_reader"),
             "role parameters are undefined: [data_reader]"),
            (("user", "add", "x", "--group", "nope"), "Groups do not exist: nope"),
            (("user", "add", "x"), "no role given"),
            (("group", "add", "g", "--role", "admin[a]"),
             "Cannot assign roles to group because"),
            (("group", "add", "bad name", "--role", "admin"), "Group name must not contain"),
            (("group", "remove", "nope"), "no group nope")):
        line = _one_error_line(cli(*args, env_extra={"DCPTOOL_PASSWORD": SECRET}))
        assert words in line, (args, line)
    r = cli("group", "remove", "readers", "--json")
    assert json_lines(r.stdout) == [{"group": "readers", "removed": True}]
    r = cli("user", "list", "--json")
    assert json_lines(r.stdout)[0]["users"][1] == {"username": "bk",
                                                   "roles": ["ro_admin", "data_backup[travel]"],
                                                   "groups": []}
