"""Creating, editing and dropping buckets over the node's REST port, as Couchbase Server's
cluster manager does it (docs/rest.md):

    POST   /pools/default/buckets        name=N ramQuota=MB [settings]  -> 202, empty body
    POST   /pools/default/buckets/NAME   settings                       -> 200, empty body
    DELETE /pools/default/buckets/NAME                                  -> 200, empty body

The settings are Couchbase Server's parameters (`dcptool.node.bucketset.parse_settings`):
ramQuota (or ramQuotaMB) in MiB, bucketType couchbase|membase, replicaNumber 0-3,
evictionPolicy valueOnly|fullEviction, maxTTL, compressionMode off|passive|active,
conflictResolutionType seqno|lww, durabilityMinLevel, numVBuckets (the node's own count
when absent) and flushEnabled 0|1. An edit may not change the name, type, conflict
resolution or vbucket count. Invalid settings are answered 400 `{"errors": {FIELD: MSG}}`,
a name already taken 400 `{"errors": {"name": "Bucket with given name already exists"}}`,
an unknown bucket 404 "Requested resource not found.". The node's first bucket (--bucket)
holds its data in the data directory itself and is not dropped over REST (400); its
evictionPolicy and ramQuota are the node's --eviction and --memory-quota (an edit of
either is 400).

On a member of a cluster each change is made on every member (`dcptool.node.bucketshare`:
the member forwards the request to the others with the caller's credentials) and a new
bucket gets its cluster map on every member. A member that could not do it is named in a
503 `{"errors": {"_": "..."}}`; a create that failed on a member is undone on the others.

Each needs the NodeManagement privilege (the admin role); Couchbase asks the same of
cluster.buckets!create and cluster.bucket[NAME].settings!write. The bucket listing and
the bucket documents, with the settings under their Couchbase names, are `dcptool.node.rest`'s.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from . import bucketshare
from .access import Privilege
from .bucketset import SettingsError, default_settings, parse_settings, valid_bucket_name


def settings_doc(bucket, replicas: int = 0) -> dict[str, Any]:
    """The bucket's settings as GET /pools/default/buckets/NAME returns them (`replicas`:
    the cluster map's replica count, which a cluster's first bucket reports)."""
    s = bucket.settings
    out: dict[str, Any] = {}
    for field in ("evictionPolicy", "maxTTL", "compressionMode", "conflictResolutionType",
                  "durabilityMinLevel"):
        if field in s:
            out[field] = s[field]
    out["replicaNumber"] = max(replicas, int(s.get("replicaNumber", 0)))
    if s.get("flushEnabled"):
        out["controllers"] = {"flush": f"/pools/default/buckets/{bucket.name}/controller/"
                                        "doFlush"}
    out["bucketType"] = "membase"
    return out


def add_routes(app: web.Application, node, guard) -> None:
    """Register the bucket endpoints of `node` on `app`; `guard(handler, privilege)` wraps
    a handler in the REST port's authentication and privilege check."""
    manage = Privilege.NODE_MANAGEMENT

    def error(errors: dict[str, str]) -> web.Response:
        return web.json_response({"errors": errors}, status=400)

    def unavailable(text: str) -> web.Response:
        return web.json_response({"errors": {"_": text}}, status=503)

    async def create(request: web.Request, user: str) -> web.Response:
        form = await request.post()
        name = str(form.get("name", ""))
        errors: dict[str, str] = {}
        bad = valid_bucket_name(name)
        if bad:
            errors["name"] = bad
        elif name.lower() in {n.lower() for n in (*node.buckets, *node.busy_buckets)}:
            errors["name"] = "Bucket with given name already exists"
        try:
            settings = parse_settings(form, _base(node), create=True,
                                      node_vbuckets=node.config.vbuckets)
        except SettingsError as exc:
            errors.update(exc.errors)
        if "ramQuota" not in form and "ramQuotaMB" not in form:
            errors.setdefault("ramQuota", "The RAM Quota value must be a number.")
        if errors:
            return error(errors)
        bucket = await node.create_bucket(name, settings)
        if bucketshare.clustered(node) and not bucketshare.forwarded(request):
            fwd = {k: str(v) for k, v in form.items()}
            failed = await bucketshare.forward(node, request, "POST",
                                               "/pools/default/buckets", fwd)
            if failed:
                # undone where it was done: a bucket exists on every member or on none
                done = [m for m in bucketshare.other_members(node) if m not in failed]
                if done:
                    await bucketshare.forward(node, request, "DELETE",
                                              f"/pools/default/buckets/{name}", members=done)
                await node.drop_bucket(bucket)
                return unavailable(f"Bucket {name} was not created: the member(s) could not "
                                   f"create it: {bucketshare.failed_text(failed)}")
            failed = await bucketshare.map_bucket(node, bucket)
            if failed:
                return unavailable(f"Bucket {name} was created but not mapped on "
                                   f"{bucketshare.failed_text(failed)}")
        return web.Response(status=202)

    async def edit(request: web.Request, user: str) -> web.Response:
        bucket = node.buckets.get(request.match_info["name"])
        if bucket is None:
            return _not_found()
        form = await request.post()
        try:
            settings = parse_settings(form, bucket.settings, create=False,
                                      node_vbuckets=node.config.vbuckets)
        except SettingsError as exc:
            return error(exc.errors)
        if bucket is node.bucket:
            # the first bucket's eviction and quota are the node's options
            fixed = {"evictionPolicy": "--eviction", "ramQuota": "--memory-quota"}
            changed = {f: f"The node's first bucket takes its {f} from the node's {opt} "
                          "option" for f, opt in fixed.items()
                       if settings.get(f) != bucket.settings.get(f)}
            if changed:
                return error(changed)
        await node.edit_bucket(bucket, settings)
        failed = await bucketshare.share(node, request, "POST",
                                         f"/pools/default/buckets/{bucket.name}",
                                         {k: str(v) for k, v in form.items()})
        if failed:
            return unavailable(f"Bucket {bucket.name} was not changed on "
                               f"{bucketshare.failed_text(failed)}")
        return web.Response(status=200)

    async def drop(request: web.Request, user: str) -> web.Response:
        bucket = node.buckets.get(request.match_info["name"])
        if bucket is None:
            return _not_found()
        if bucket is node.bucket:
            return error({"_": f"Bucket {bucket.name} is the node's first bucket (--bucket) "
                               "and cannot be dropped"})
        name = bucket.name
        await node.drop_bucket(bucket)
        failed = await bucketshare.share(node, request, "DELETE",
                                         f"/pools/default/buckets/{name}")
        if failed:
            return unavailable(f"Bucket {name} was not dropped on "
                               f"{bucketshare.failed_text(failed)}")
        return web.Response(status=200)

    app.router.add_post("/pools/default/buckets", guard(create, manage))
    app.router.add_post("/pools/default/buckets/{name}", guard(edit, manage))
    app.router.add_delete("/pools/default/buckets/{name}", guard(drop, manage))


def _base(node) -> dict[str, Any]:
    """A new bucket's settings before the form's: the node's defaults, value eviction."""
    base = default_settings(node.config)
    base["evictionPolicy"] = "valueOnly"
    del base["ramQuota"]
    del base["numVBuckets"]
    return base


def _not_found() -> web.Response:
    return web.Response(status=404, text="Requested resource not found.\r\n")
