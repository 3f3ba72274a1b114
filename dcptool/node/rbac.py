"""Couchbase Server's RBAC REST endpoints on the node's REST port (docs/rest.md).

    GET    /settings/rbac/roles                   every role the node knows
    GET    /settings/rbac/users                   every user (all local)
    GET    /settings/rbac/users/local             the same
    GET    /settings/rbac/users/local/NAME        one user           (404 "Unknown user.")
    PUT    /settings/rbac/users/local/NAME        password=, roles=, groups=, name=
    DELETE /settings/rbac/users/local/NAME                           (404 "User was not found.")
    GET    /settings/rbac/groups[/NAME]           groups, or one     (404 "Unknown group.")
    PUT    /settings/rbac/groups/NAME             roles=, description=
    DELETE /settings/rbac/groups/NAME                                (404 "Group was not found.")
    GET    /settings/rbac/backup                  users and groups with their SCRAM secrets
    PUT    /settings/rbac/backup                  backup=JSON [canOverwrite=true|false]

Shapes are Couchbase Server's: a user is `{"id", "domain": "local", "roles": [{"role",
"bucket_name", "scope_name", "collection_name", "origins": [...]}], "groups",
"external_groups", "name"}`; a group `{"id", "roles", "ldap_group_ref", "description"}`.
Roles are given as Couchbase spells them, comma-separated: `data_reader[travel],ro_admin`.
Errors are Couchbase's: 400 `{"errors": {"roles": "Cannot assign roles to user because the
following roles are unknown, malformed or role parameters are undefined: [...]"}}`, 400
`{"errors": {"groups": "Groups do not exist: ..."}}`, 404 for a missing user or group.

The backup document is Couchbase 7.6's (`{"version": "1", "users": [...], "groups":
[...]}`): each local user with `auth` holding its SCRAM credentials (`scram-sha-512`,
`scram-sha-256`, `scram-sha-1`: salt, iterations, stored and server keys), never a
password. This node keeps no separate built-in administrator, so the document has no
`admin` entry. PUT creates the users and groups the node lacks and, with
`canOverwrite=true`, replaces those it has; it answers the counts and names, as Couchbase.

Every endpoint needs the `admin` or `security_admin` role (own or a group's), as
Couchbase's need the Full or Security Administrator. A change is written to
`DIR/users.json` and applied at once to the node's open connections.

Users and groups are the cluster's, as in Couchbase Server: on a member of a cluster, a
change made over REST is made there and then forwarded, the same request with the caller's
credentials, to every other member (node/bucketshare.py `forward`; a forwarded request is
not forwarded again). A member that did not take it is named in a 503 answer; the change
stays made where it was made (sending it again makes it everywhere: each change sets, it
does not add). `dcptool node user|group` edit one stopped node's file and are not shared.
"""
from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from aiohttp import hdrs, web

from .access import (
    BAD_GROUP, BAD_USERNAME, BUCKET_ROLES, CLUSTER_ROLES, ROLES, COLLECTION_ROLES, SCOPE_ROLES,
    bad_name, check_roles, parse_role,
)
from .auth import MECHANISMS, REST_CHALLENGE, Users

#: roles that may use these endpoints
ADMIN_ROLES = ("admin", "security_admin")
#: Couchbase's default password policy: at least this many characters
MIN_PASSWORD = 6

_DESCRIPTIONS = {
    "admin": ("Full Admin", "Can manage all cluster features (including security)."),
    "backup": ("Backup (dcptool)", "Can stream DCP, read failover logs and manage high "
                                   "watermarks."),
    "restore": ("Restore (dcptool)", "Can write documents with their metadata."),
    "reader": ("Reader (dcptool)", "Can read documents."),
    "writer": ("Writer (dcptool)", "Can write and delete documents."),
    "scope_admin": ("Manage Scopes", "Can create and drop scopes and collections."),
    "ro_admin": ("Read-Only Admin", "Can view cluster and bucket information."),
    "security_admin": ("Security Admin", "Can manage users and groups."),
    "cluster_admin": ("Cluster Admin", "Can manage the cluster, not security."),
    "replication_admin": ("XDCR Admin", "Can view cluster information."),
    "bucket_full_access": ("Application Access", "Full access to bucket data."),
    "bucket_admin": ("Bucket Admin", "Can manage the bucket, not read its data."),
    "data_backup": ("Data Backup & Restore", "Can back up and restore the bucket's data."),
    "data_reader": ("Data Reader", "Can read data."),
    "data_writer": ("Data Writer", "Can write data."),
    "data_dcp_reader": ("Data DCP Reader", "Can stream data over DCP."),
    "data_monitoring": ("Data Monitor", "Can read statistics."),
    "replication_target": ("XDCR Inbound", "Can write replicated data with its metadata."),
}


def _json(doc: Any, status: int = 200) -> web.Response:
    resp = web.json_response(doc, status=status)
    resp.headers[hdrs.CACHE_CONTROL] = "no-cache,no-store,must-revalidate"
    return resp


def _errors(field: str, message: str, status: int = 400) -> web.Response:
    return _json({"errors": {field: message}}, status=status)


def role_entries(users: Users, username: str) -> list[dict]:
    """The user's roles in Couchbase's shape, each with where it comes from."""
    seen: dict[str, dict] = {}
    for text, origin in ([(r, {"type": "user"}) for r in users.roles(username)]
                         + [(r, {"type": "group", "name": g})
                            for g in users.user_groups(username)
                            for r in users.group_roles(g)]):
        try:
            role = parse_role(text)
        except ValueError:
            continue
        entry = seen.setdefault(str(role), {**role.to_json(), "origins": []})
        entry["origins"].append(origin)
    return list(seen.values())


def user_doc(users: Users, username: str) -> dict:
    entry = users.users[username]
    doc = {"id": username, "domain": "local", "roles": role_entries(users, username),
           "groups": users.user_groups(username), "external_groups": [],
           "name": entry.get("name", "")}
    if entry.get("password_change_date"):
        doc["password_change_date"] = entry["password_change_date"]
    return doc


def group_doc(users: Users, group: str) -> dict:
    roles = []
    for text in users.group_roles(group):
        try:
            roles.append(parse_role(text).to_json())
        except ValueError:
            continue
    return {"id": group, "roles": roles, "ldap_group_ref": "",
            "description": users.groups[group].get("description", "")}


def roles_doc() -> list[dict]:
    out = []
    for name in dict.fromkeys([*ROLES, *CLUSTER_ROLES, *BUCKET_ROLES]):
        title, desc = _DESCRIPTIONS.get(name, (name, ""))
        doc: dict[str, Any] = {"role": name, "name": title, "desc": desc}
        if name in BUCKET_ROLES:
            doc["bucket_name"] = "*"
            if name in SCOPE_ROLES:
                doc["scope_name"] = "*"
            if name in COLLECTION_ROLES:
                doc["collection_name"] = "*"
        out.append(doc)
    return out


# -- the backup document ------------------------------------------------------------------

def _auth_export(scram: dict) -> dict:
    out = {}
    for cb_name, iana in MECHANISMS.items():
        cred = scram.get(cb_name)
        if not cred:
            continue
        out[iana.lower()] = {"salt": cred["salt"], "iterations": int(cred["iterations"]),
                             "hashes": [{"stored_key": cred["stored_key"],
                                         "server_key": cred["server_key"]}]}
    return out


def _auth_import(auth: Any) -> dict:
    """Couchbase's `auth` -> this node's `scram`; ValueError unless SCRAM-SHA512 is there
    (PLAIN logins check against it)."""
    if not isinstance(auth, dict):
        raise ValueError("auth is not an object")
    out = {}
    for cb_name, iana in MECHANISMS.items():
        cred = auth.get(iana.lower())
        if cred is None:
            continue
        hashes = cred.get("hashes") or []
        if not hashes or not isinstance(hashes[0], dict):
            raise ValueError(f"{iana.lower()} has no hashes")
        for part in (cred["salt"], hashes[0]["stored_key"], hashes[0]["server_key"]):
            base64.b64decode(part, validate=True)
        out[cb_name] = {"salt": cred["salt"], "iterations": int(cred["iterations"]),
                        "stored_key": hashes[0]["stored_key"],
                        "server_key": hashes[0]["server_key"]}
    if "SCRAM-SHA512" not in out:
        raise ValueError("no scram-sha-512 credentials")
    return out


def _selected(kind: str, name: str, include: list[str], exclude: list[str]) -> bool:
    """Couchbase's include/exclude filters: `user:local:NAME`, `user:*:*`, `group:NAME`,
    `group:*`, `admin` (the node has no separate admin)."""
    def match(pattern: str) -> bool:
        parts = pattern.split(":")
        if kind == "user":
            return (len(parts) == 3 and parts[0] == "user" and parts[1] in ("local", "*")
                    and parts[2] in ("*", name))
        return len(parts) == 2 and parts[0] == "group" and parts[1] in ("*", name)
    if include:
        return any(match(p) for p in include)
    return not any(p == "*" or match(p) for p in exclude)


def backup_doc(users: Users, include=(), exclude=()) -> dict:
    doc: dict[str, Any] = {"version": "1", "users": [], "groups": []}
    for name in sorted(users.users):
        if not _selected("user", name, list(include), list(exclude)):
            continue
        entry = users.users[name]
        doc["users"].append({"id": name, "domain": "local",
                             "groups": users.user_groups(name), "roles": users.roles(name),
                             "name": entry.get("name", ""),
                             "auth": _auth_export(entry.get("scram", {}))})
    for name in sorted(users.groups):
        if not _selected("group", name, list(include), list(exclude)):
            continue
        doc["groups"].append({"name": name,
                              "description": users.groups[name].get("description", ""),
                              "roles": users.group_roles(name)})
    return doc


def restore_backup(users: Users, doc: Any, can_overwrite: bool) -> dict:
    """Apply a backup document to `users` (ValueError: what is wrong with it)."""
    if not isinstance(doc, dict) or str(doc.get("version")) != "1":
        raise ValueError("Unsupported backup version")
    groups_in = doc.get("groups") or []
    users_in = doc.get("users") or []
    if not isinstance(groups_in, list) or not isinstance(users_in, list):
        raise ValueError("users and groups must be lists")
    stats = {"usersCreated": 0, "usersOverwritten": 0, "usersSkipped": 0,
             "groupsCreated": 0, "groupsOverwritten": 0, "groupsSkipped": 0}
    out: dict[str, Any] = {"stats": stats, "usersSkipped": [], "usersOverwritten": [],
                           "groupsSkipped": [], "groupsOverwritten": []}
    groups: list[tuple[str, list[str], str]] = []
    for g in groups_in:
        if not isinstance(g, dict) or not isinstance(g.get("name"), str) or bad_name(g["name"]):
            raise ValueError(f"invalid group {g!r:.80}")
        roles = check_roles(g.get("roles") or [], what="group", allow_empty=True)
        groups.append((g["name"], roles, str(g.get("description") or "")))
    known = set(users.groups) | {g[0] for g in groups}
    entries: list[tuple[str, dict]] = []
    for u in users_in:
        if not isinstance(u, dict) or not isinstance(u.get("id"), str) or bad_name(u["id"]):
            raise ValueError(f"invalid user {u!r:.80}")
        if u.get("domain", "local") != "local":
            continue  # no external users on this node
        roles = check_roles(u.get("roles") or [], allow_empty=True)
        member = [g for g in (u.get("groups") or []) if isinstance(g, str)]
        missing = [g for g in member if g not in known]
        if missing:
            raise ValueError(f"Groups do not exist: {','.join(missing)}")
        entry: dict[str, Any] = {"scram": _auth_import(u.get("auth")), "roles": roles}
        if member:
            entry["groups"] = member
        if u.get("name"):
            entry["name"] = str(u["name"])
        entries.append((u["id"], entry))
    for name, roles, description in groups:
        if name in users.groups:
            if not can_overwrite:
                stats["groupsSkipped"] += 1
                out["groupsSkipped"].append(name)
                continue
            stats["groupsOverwritten"] += 1
            out["groupsOverwritten"].append(name)
        else:
            stats["groupsCreated"] += 1
        users.groups[name] = {"roles": roles, "description": description}
    for name, entry in entries:
        who = {"name": name, "domain": "local"}
        if name in users.users:
            if not can_overwrite:
                stats["usersSkipped"] += 1
                out["usersSkipped"].append(who)
                continue
            stats["usersOverwritten"] += 1
            out["usersOverwritten"].append(who)
        else:
            stats["usersCreated"] += 1
        users.users[name] = entry
    return out


# -- the endpoints ------------------------------------------------------------------------

class RbacApp:
    """The RBAC endpoints over one node, with the REST port's authentication."""

    def __init__(self, rest) -> None:
        self.rest = rest
        self.node = rest.node
        self._lock = asyncio.Lock()

    def register(self, app: web.Application) -> None:
        base = "/settings/rbac"
        for method, path, handler, write in (
                ("GET", "/roles", self.list_roles, False),
                ("GET", "/users", self.list_users, False),
                ("GET", "/users/local", self.list_users, False),
                ("GET", "/users/local/{id}", self.get_user, False),
                ("PUT", "/users/local/{id}", self.put_user, True),
                ("DELETE", "/users/local/{id}", self.delete_user, True),
                ("GET", "/groups", self.list_groups, False),
                ("GET", "/groups/{id}", self.get_group, False),
                ("PUT", "/groups/{id}", self.put_group, True),
                ("DELETE", "/groups/{id}", self.delete_group, True),
                ("GET", "/backup", self.get_backup, False),
                ("PUT", "/backup", self.put_backup, True)):
            app.router.add_route(method, base + path, self._guard(handler, write))

    def _guard(self, handler, write: bool):
        async def guarded(request: web.Request) -> web.StreamResponse:
            name = await self.rest.auth.user(request)
            if name is None:
                return web.Response(status=401, headers={hdrs.WWW_AUTHENTICATE: REST_CHALLENGE})
            held = self.node.users.effective_roles(name)
            if not any(r in held for r in ADMIN_ROLES):
                need = "cluster.admin.security!" + ("write" if write else "read")
                return _json({"message": "Forbidden. User needs the following permissions",
                              "permissions": [need]}, status=403)
            response = await handler(request)
            if write and response.status == 200:
                return await self._share(request, response)
            return response
        return guarded

    async def _share(self, request: web.Request, response: web.Response) -> web.Response:
        """A change made here, made on every other member of the cluster too."""
        from . import bucketshare

        body = await request.read()  # the body the handler read, kept by aiohttp
        failed = await bucketshare.share(self.node, request, request.method,
                                         request.path_qs, body)
        if failed:
            return _json({"message": f"Done on this node, not on "
                                     f"{bucketshare.failed_text(failed)}"}, status=503)
        return response

    async def _change(self, fn) -> Any:
        """Run `fn(users)` on the users file as it is now, save, and apply the result to
        the node and its connections; fn's ValueError/LookupError pass through."""
        async with self._lock:
            path = self.node.users.path
            loop = asyncio.get_running_loop()

            def work():
                users = Users.load(path.parent)
                result = fn(users)
                users.save()
                return users, result
            users, result = await loop.run_in_executor(None, work)
            self.node.users = users
            apply = getattr(self.node, "apply_users", None)
            if apply is not None:
                apply()
            return result

    async def list_roles(self, request: web.Request) -> web.Response:
        return _json(roles_doc())

    async def list_users(self, request: web.Request) -> web.Response:
        users = self.node.users
        return _json([user_doc(users, n) for n in sorted(users.users)])

    async def get_user(self, request: web.Request) -> web.Response:
        users, name = self.node.users, request.match_info["id"]
        if name not in users.users:
            return _json("Unknown user.", status=404)
        return _json(user_doc(users, name))

    async def put_user(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        form = await request.post()
        if bad_name(name):
            return _errors("_", BAD_USERNAME)
        password = form.get("password")
        if password is not None and len(str(password)) < MIN_PASSWORD:
            return _errors("password",
                           f"The password must be at least {MIN_PASSWORD} characters long.")
        try:
            roles = check_roles([str(form.get("roles", ""))], allow_empty=True)
        except ValueError as exc:
            return _errors("roles", str(exc))
        groups = [g for g in str(form.get("groups", "")).split(",") if g.strip()]
        full_name = str(form.get("name", ""))

        def change(users: Users):
            if password is None and name not in users.users:
                raise LookupError("password")
            existing = users.users.get(name, {})
            users.add(name, None if password is None else str(password), roles, groups,
                      name=full_name, allow_no_roles=True)
            if password is None and existing.get("password_change_date"):
                users.users[name]["password_change_date"] = existing["password_change_date"]
        try:
            await self._change(change)
        except LookupError:
            return _errors("password", "Password is required for a new user.")
        except ValueError as exc:
            return _errors("groups", str(exc))
        return _json("")

    async def delete_user(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        if name not in self.node.users.users:
            return _json("User was not found.", status=404)
        removed = await self._change(lambda users: users.remove(name))
        if not removed:
            return _json("User was not found.", status=404)
        return _json("")

    async def list_groups(self, request: web.Request) -> web.Response:
        users = self.node.users
        return _json([group_doc(users, g) for g in sorted(users.groups)])

    async def get_group(self, request: web.Request) -> web.Response:
        users, name = self.node.users, request.match_info["id"]
        if name not in users.groups:
            return _json("Unknown group.", status=404)
        return _json(group_doc(users, name))

    async def put_group(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        form = await request.post()
        if bad_name(name):
            return _errors("_", BAD_GROUP)
        try:
            roles = check_roles([str(form.get("roles", ""))], what="group", allow_empty=True)
        except ValueError as exc:
            return _errors("roles", str(exc))
        description = str(form.get("description", ""))
        await self._change(lambda users: users.set_group(name, roles, description))
        return _json("")

    async def delete_group(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        if name not in self.node.users.groups:
            return _json("Group was not found.", status=404)
        removed = await self._change(lambda users: users.remove_group(name))
        if not removed:
            return _json("Group was not found.", status=404)
        return _json("")

    async def get_backup(self, request: web.Request) -> web.Response:
        include = request.query.getall("include", [])
        exclude = request.query.getall("exclude", [])
        if include and exclude:
            return _errors("include", "include and exclude are mutually exclusive")
        return _json(backup_doc(self.node.users, include, exclude))

    async def put_backup(self, request: web.Request) -> web.Response:
        if request.content_type == "application/json":
            text, overwrite = await request.text(), request.query.get("canOverwrite", "false")
        else:
            form = await request.post()
            text, overwrite = form.get("backup"), str(form.get("canOverwrite", "false"))
        if overwrite not in ("true", "false"):
            return _errors("canOverwrite",
                           "The value must be one of the following: [true,false]")
        if text is None:
            return _errors("backup", "The value must be supplied")
        try:
            doc = json.loads(str(text))
        except ValueError:
            return _errors("backup", "Invalid JSON")
        try:
            result = await self._change(
                lambda users: restore_backup(users, doc, overwrite == "true"))
        except (ValueError, KeyError, TypeError) as exc:
            return _errors("backup", str(exc) or type(exc).__name__)
        return _json(result)


def register(app: web.Application, rest) -> None:
    """Add the RBAC endpoints to the REST app of `rest` (a `RestApp`)."""
    RbacApp(rest).register(app)
