"""Couchbase Server's RBAC REST endpoints (/settings/rbac/...) on real node processes, read
and written with urllib: users and groups created, listed and deleted in Couchbase's shapes
and with its errors, only for administrators; a change applies to open connections; the
backup endpoint's document moves users to a fresh node, where they log in."""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from client.nodeutil import write_docs
from dcptool.client import Connection
from dcptool.protocol.constants import Status
from dcptool.protocol.messages import Get
from dcptool.protocol.vbucket import vbucket_of

VBS = 4
ADMIN = ("Administrator", "password")
ROLE_ERROR = ("Cannot assign roles to {} because the following roles are unknown, malformed "
              "or role parameters are undefined: [{}]")


def call(node, method: str, path: str, form: dict | None = None, auth=ADMIN):
    """(status, decoded JSON body or text)."""
    data = None if form is None else urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{node.rest_port}{path}", data=data,
                                 method=method)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as rsp:
            status, body = rsp.status, rsp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


@pytest.fixture(scope="module")
def node(module_node_factory):
    n = module_node_factory("rbac", vbuckets=VBS, bucket="a", password=ADMIN[1])
    write_docs(n, {b"doc1": b"v1"})
    return n


def _get(c, key=b"doc1"):
    return c.request(Get(key=key, vbucket=vbucket_of(key, VBS))).status


def test_create_list_and_delete_a_user(node):
    st, body = call(node, "PUT", "/settings/rbac/users/local/dgreen",
                    {"password": "pwdpwd", "roles": "data_reader[a],ro_admin",
                     "name": "D Green"})
    assert (st, body) == (200, "")
    st, user = call(node, "GET", "/settings/rbac/users/local/dgreen")
    assert st == 200
    assert user["id"] == "dgreen" and user["domain"] == "local" and user["name"] == "D Green"
    assert user["groups"] == [] and user["external_groups"] == []
    assert user["roles"] == [
        {"role": "ro_admin", "origins": [{"type": "user"}]},
        {"role": "data_reader", "bucket_name": "a", "origins": [{"type": "user"}]}]
    assert "password" not in json.dumps(user).replace("password_change_date", "")
    for path in ("/settings/rbac/users", "/settings/rbac/users/local"):
        st, users = call(node, "GET", path)
        assert st == 200 and {u["id"] for u in users} >= {"Administrator", "dgreen"}
    with Connection.open(node.host, node.port, username="dgreen", password="pwdpwd",
                         bucket="a") as c:
        assert _get(c) == Status.SUCCESS
    assert call(node, "DELETE", "/settings/rbac/users/local/dgreen") == (200, "")
    assert call(node, "DELETE", "/settings/rbac/users/local/dgreen") == (404, "User was not found.")
    assert call(node, "GET", "/settings/rbac/users/local/dgreen") == (404, "Unknown user.")


def test_refusals_in_couchbase_words(node):
    path = "/settings/rbac/users/local/x1"
    assert call(node, "PUT", path, {"password": "pwdpwd", "roles": "ro_admine"}) == (
        400, {"errors": {"roles": ROLE_ERROR.format("user", "ro_admine")}})
    assert call(node, "PUT", path, {"password": "pwdpwd", "roles": "data_reader"}) == (
        400, {"errors": {"roles": ROLE_ERROR.format("user", "data_reader")}})
    assert call(node, "PUT", path, {"password": "pwdpwd", "groups": "nope,nada"}) == (
        400, {"errors": {"groups": "Groups do not exist: nope,nada"}})
    st, body = call(node, "PUT", path, {"password": "abc", "roles": "ro_admin"})
    assert st == 400 and "at least 6 characters" in body["errors"]["password"]
    assert call(node, "PUT", "/settings/rbac/groups/g", {"roles": "bucket_admin"}) == (
        400, {"errors": {"roles": ROLE_ERROR.format("group", "bucket_admin")}})
    assert call(node, "DELETE", "/settings/rbac/groups/none") == (404, "Group was not found.")
    assert call(node, "GET", "/settings/rbac/users/local/x1")[0] == 404


def test_groups_create_list_delete_and_give_roles(node):
    assert call(node, "PUT", "/settings/rbac/groups/readers",
                {"roles": "data_reader[*]", "description": "Read every bucket"}) == (200, "")
    st, group = call(node, "GET", "/settings/rbac/groups/readers")
    assert st == 200 and group == {"id": "readers", "roles": [{"role": "data_reader",
                                                               "bucket_name": "*"}],
                                   "ldap_group_ref": "", "description": "Read every bucket"}
    st, groups = call(node, "GET", "/settings/rbac/groups")
    assert st == 200 and [g["id"] for g in groups] == ["readers"]
    assert call(node, "PUT", "/settings/rbac/users/local/sdavis",
                {"password": "Sd4v1s938", "groups": "readers"}) == (200, "")
    st, user = call(node, "GET", "/settings/rbac/users/local/sdavis")
    assert user["groups"] == ["readers"]
    assert user["roles"] == [{"role": "data_reader", "bucket_name": "*",
                              "origins": [{"type": "group", "name": "readers"}]}]
    with Connection.open(node.host, node.port, username="sdavis", password="Sd4v1s938",
                         bucket="a") as c:
        assert _get(c) == Status.SUCCESS
        # deleting the group takes its roles, from this open connection too
        assert call(node, "DELETE", "/settings/rbac/groups/readers") == (200, "")
        assert _get(c) == Status.EACCESS
    assert call(node, "GET", "/settings/rbac/groups/readers") == (404, "Unknown group.")
    st, user = call(node, "GET", "/settings/rbac/users/local/sdavis")
    assert user["groups"] == [] and user["roles"] == []
    call(node, "DELETE", "/settings/rbac/users/local/sdavis")


def test_a_role_change_applies_to_open_connections(node):
    call(node, "PUT", "/settings/rbac/users/local/live",
         {"password": "livepw1", "roles": "data_reader[a]"})
    with Connection.open(node.host, node.port, username="live", password="livepw1",
                         bucket="a") as c:
        assert _get(c) == Status.SUCCESS
        # no password: the user keeps its own
        assert call(node, "PUT", "/settings/rbac/users/local/live",
                    {"roles": "data_reader[b]"}) == (200, "")
        assert _get(c) == Status.EACCESS
    with pytest.raises(Exception, match="may not use bucket 'a'"):
        Connection.open(node.host, node.port, username="live", password="livepw1", bucket="a")
    call(node, "DELETE", "/settings/rbac/users/local/live")


def test_only_administrators(node):
    call(node, "PUT", "/settings/rbac/users/local/plain",
         {"password": "plainpw", "roles": "bucket_full_access[*],cluster_admin"})
    call(node, "PUT", "/settings/rbac/users/local/sec",
         {"password": "secpw1", "roles": "security_admin"})
    for method, path in (("GET", "/settings/rbac/users"), ("GET", "/settings/rbac/backup"),
                         ("PUT", "/settings/rbac/users/local/evil"),
                         ("DELETE", "/settings/rbac/users/local/Administrator")):
        form = {"password": "evilpw", "roles": "admin"} if method == "PUT" else None
        st, body = call(node, method, path, form, auth=("plain", "plainpw"))
        assert st == 403, (method, path)
        assert body["message"] == "Forbidden. User needs the following permissions"
        assert call(node, method, path, form, auth=None)[0] == 401
        assert call(node, method, path, form, auth=("Administrator", "wrong"))[0] == 401
    assert call(node, "GET", "/settings/rbac/users/local/evil")[0] == 404
    st, users = call(node, "GET", "/settings/rbac/users", auth=("sec", "secpw1"))
    assert st == 200 and "plain" in {u["id"] for u in users}
    for name in ("plain", "sec"):
        call(node, "DELETE", f"/settings/rbac/users/local/{name}")


def test_roles_list(node):
    st, roles = call(node, "GET", "/settings/rbac/roles")
    assert st == 200
    by_name = {r["role"]: r for r in roles}
    assert by_name["data_backup"]["bucket_name"] == "*"
    assert by_name["data_reader"]["collection_name"] == "*"
    assert "bucket_name" not in by_name["admin"] and "bucket_name" not in by_name["ro_admin"]
    assert {"backup", "restore", "reader", "writer", "scope_admin", "bucket_full_access",
            "bucket_admin"} <= set(by_name)


def test_backup_round_trips_to_a_fresh_node(node, node_factory):
    call(node, "PUT", "/settings/rbac/groups/bk", {"roles": "data_backup[a]",
                                                   "description": "backups"})
    call(node, "PUT", "/settings/rbac/users/local/carol",
         {"password": "carol-secret-77", "roles": "data_reader[a]", "groups": "bk",
          "name": "Carol"})
    st, doc = call(node, "GET", "/settings/rbac/backup")
    assert st == 200 and doc["version"] == "1" and "admin" not in doc
    assert "carol-secret-77" not in json.dumps(doc)
    carol = next(u for u in doc["users"] if u["id"] == "carol")
    assert carol["domain"] == "local" and carol["groups"] == ["bk"]
    assert carol["roles"] == ["data_reader[a]"] and carol["name"] == "Carol"
    assert set(carol["auth"]) == {"scram-sha-512", "scram-sha-256", "scram-sha-1"}
    sha512 = carol["auth"]["scram-sha-512"]
    assert set(sha512) == {"salt", "iterations", "hashes"}
    assert set(sha512["hashes"][0]) == {"stored_key", "server_key"}
    assert doc["groups"] == [{"name": "bk", "description": "backups",
                              "roles": ["data_backup[a]"]}]
    st, only = call(node, "GET", "/settings/rbac/backup?include=user:local:carol")
    assert [u["id"] for u in only["users"]] == ["carol"] and only["groups"] == []
    st, body = call(node, "GET", "/settings/rbac/backup?include=admin&exclude=group:*")
    assert (st, body) == (400, {"errors": {"include":
                                           "include and exclude are mutually exclusive"}})

    fresh = node_factory("fresh", vbuckets=VBS, bucket="a", password=ADMIN[1])
    write_docs(fresh, {b"doc1": b"v1"})
    st, res = call(fresh, "PUT", "/settings/rbac/backup", {"backup": json.dumps(doc)})
    assert st == 200
    n = len(doc["users"])
    assert res["stats"] == {"usersCreated": n - 1, "usersOverwritten": 0, "usersSkipped": 1,
                            "groupsCreated": 1, "groupsOverwritten": 0, "groupsSkipped": 0}
    assert res["usersSkipped"] == [{"name": "Administrator", "domain": "local"}]
    # carol logs in to the fresh node with her password (SCRAM and PLAIN), with her roles
    with Connection.open(fresh.host, fresh.port, username="carol", password="carol-secret-77",
                         bucket="a") as c:
        assert _get(c) == Status.SUCCESS
    assert call(fresh, "GET", "/pools", auth=("carol", "carol-secret-77"))[0] == 200
    assert call(fresh, "GET", "/settings/rbac/groups/bk")[1]["description"] == "backups"
    # again: everything is there, skipped; with canOverwrite=true, overwritten
    st, res = call(fresh, "PUT", "/settings/rbac/backup",
                   {"backup": json.dumps(doc), "canOverwrite": "false"})
    assert res["stats"]["usersSkipped"] == n and res["stats"]["groupsSkipped"] == 1
    st, res = call(fresh, "PUT", "/settings/rbac/backup",
                   {"backup": json.dumps(doc), "canOverwrite": "true"})
    assert res["stats"]["usersOverwritten"] == n and res["stats"]["groupsOverwritten"] == 1
    assert res["groupsOverwritten"] == ["bk"]
    st, body = call(fresh, "PUT", "/settings/rbac/backup", {"backup": "{", "canOverwrite": "x"})
    assert st == 400 and "canOverwrite" in body["errors"]
    st, body = call(fresh, "PUT", "/settings/rbac/backup", {"backup": "{"})
    assert st == 400 and "backup" in body["errors"]
    bad = dict(doc, groups=[{"name": "g", "roles": ["nope"]}])
    st, body = call(fresh, "PUT", "/settings/rbac/backup", {"backup": json.dumps(bad)})
    assert st == 400 and "nope" in body["errors"]["backup"]
    call(node, "DELETE", "/settings/rbac/users/local/carol")
    call(node, "DELETE", "/settings/rbac/groups/bk")
