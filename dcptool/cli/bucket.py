"""`dcptool bucket`: list, create, edit and drop the buckets of a node.

Through the node's REST port (Couchbase's `/pools/default/buckets` endpoints, with their
parameter names), as `couchbase-cli bucket-create` does. The REST port comes from the
node's cluster config (its `mgmt` port), or `--rest-port`. Creating, editing and dropping
need the admin role.
"""
from __future__ import annotations

import urllib.parse
from enum import Enum
from typing import Annotated, Any, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import console, print_json
from dcptool.errors import DcptoolError

manual(
    "bucket",
    exit_note="1 when the node refuses the change (an invalid setting, a bucket that exists "
              "or does not, or a user without the admin role).",
    see_also=("collection", "node"),
)

bucket_app = typer.Typer(
    name="bucket",
    help="""List, create, edit and drop a node's buckets (over its REST port).

    Example: dcptool bucket create travel --ram-quota 256 --eviction-policy fullEviction
    """,
    no_args_is_help=True,
)
app.add_typer(bucket_app, name="bucket")


class Eviction(str, Enum):
    valueOnly = "valueOnly"
    fullEviction = "fullEviction"


class Compression(str, Enum):
    off = "off"
    passive = "passive"
    active = "active"


class Durability(str, Enum):
    none = "none"
    majority = "majority"
    majorityAndPersistActive = "majorityAndPersistActive"
    persistToMajority = "persistToMajority"


class ConflictResolution(str, Enum):
    seqno = "seqno"
    lww = "lww"


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
RestPortOpt = Annotated[Optional[int], typer.Option(
    "--rest-port", metavar="PORT", envvar="DCPTOOL_REST_PORT", min=1, max=65535,
    help="The node's REST port (default: the management port its cluster config names).")]
NameArg = Annotated[str, typer.Argument(metavar="NAME", show_default=False,
                                        help="The bucket's name.")]
RamOpt = Annotated[Optional[int], typer.Option(
    "--ram-quota", metavar="MIB", min=0, help="The bucket's memory quota in MiB (ramQuota; at "
                                              "least 100).")]
EvictionOpt = Annotated[Optional[Eviction], typer.Option(
    "--eviction-policy", help="valueOnly keeps every key in memory, fullEviction only the "
                              "recently used documents (evictionPolicy).")]
MaxTtlOpt = Annotated[Optional[int], typer.Option(
    "--max-ttl", metavar="SECONDS", min=0, max=0x7FFFFFFF,
    help="Documents written without an expiry, in collections without their own maximum, "
         "expire this long after the write (maxTTL; 0: never).")]
CompressionOpt = Annotated[Optional[Compression], typer.Option(
    "--compression-mode", help="compressionMode, kept and reported.")]
DurabilityOpt = Annotated[Optional[Durability], typer.Option(
    "--durability-min-level", help="durabilityMinLevel, kept and reported.")]
ReplicasOpt = Annotated[Optional[int], typer.Option(
    "--replicas", metavar="N", min=0, max=3, help="replicaNumber, kept and reported.")]
FlushOpt = Annotated[Optional[bool], typer.Option(
    "--flush/--no-flush", help="flushEnabled, kept and reported.")]


def _rest(opts, rest_port: int | None):
    from dcptool.client.rest import rest_client_for

    return rest_client_for(opts, rest_port)


def _call(rest, method: str, path: str, form: dict[str, Any] | None = None) -> Any:
    from dcptool.client.rest import RestError

    try:
        return rest.request(method, path, form)
    except RestError as exc:
        hint = "creating, editing and dropping buckets needs the admin role" if \
            exc.forbidden else None
        raise DcptoolError(str(exc), hint=hint) from None


def _path(name: str | None = None) -> str:
    base = "/pools/default/buckets"
    return base if name is None else f"{base}/{urllib.parse.quote(name, safe='')}"


def _form(ram_quota, eviction_policy, max_ttl, compression_mode, durability_min_level,
          replicas, flush) -> dict[str, Any]:
    form: dict[str, Any] = {}
    for field, value in (("ramQuota", ram_quota), ("maxTTL", max_ttl),
                         ("replicaNumber", replicas)):
        if value is not None:
            form[field] = int(value)
    for field, value in (("evictionPolicy", eviction_policy),
                         ("compressionMode", compression_mode),
                         ("durabilityMinLevel", durability_min_level)):
        if value is not None:
            form[field] = value.value
    if flush is not None:
        form["flushEnabled"] = 1 if flush else 0
    return form


def _done(what: str, name: str, json_out: bool) -> None:
    if json_out:
        print_json({what: name})
    else:
        console().print(f"{what} bucket {name}", markup=False)


@bucket_app.command("list")
@connection_options(timeout=True)
def list_buckets(
    rest_port: RestPortOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """List the node's buckets with their settings (--json: name, uuid and the settings
    under Couchbase's names).

    Example: dcptool bucket list --json
    """
    opts = conn_args.options()
    docs = _call(_rest(opts, rest_port), "GET", _path()) or []
    fields = ("name", "uuid", "bucketType", "numVBuckets", "evictionPolicy", "maxTTL",
              "compressionMode", "conflictResolutionType", "durabilityMinLevel",
              "replicaNumber")
    rows = []
    for d in docs:
        row = {f: d.get(f) for f in fields}
        row["ramQuotaMB"] = (d.get("quota") or {}).get("ram", 0) // (1024 * 1024)
        row["flushEnabled"] = "flush" in (d.get("controllers") or {})
        rows.append(row)
    if json_out:
        print_json(rows)
        return
    out = console()
    for r in rows:
        ttl = f", maxTTL {r['maxTTL']} s" if r.get("maxTTL") else ""
        out.print(f"{r['name']}: {r['numVBuckets']} vbuckets, {r['ramQuotaMB']} MiB, "
                  f"{r['evictionPolicy']}{ttl} (uuid {r['uuid']})", markup=False)


@bucket_app.command("create")
@connection_options(timeout=True)
def create(
    name: NameArg,
    ram_quota: RamOpt = None,
    eviction_policy: EvictionOpt = None,
    max_ttl: MaxTtlOpt = None,
    compression_mode: CompressionOpt = None,
    durability_min_level: DurabilityOpt = None,
    replicas: ReplicasOpt = None,
    flush: FlushOpt = None,
    conflict_resolution: Annotated[Optional[ConflictResolution], typer.Option(
        "--conflict-resolution", help="conflictResolutionType, fixed at creation.")] = None,
    num_vbuckets: Annotated[Optional[int], typer.Option(
        "--num-vbuckets", metavar="N", min=1, max=1024,
        help="64, 128 or 1024 (default: the node's own count), fixed at creation.")] = None,
    rest_port: RestPortOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a bucket (ramQuota defaults to 100 MiB).

    Example: dcptool bucket create travel --ram-quota 256 --max-ttl 86400
    """
    form = {"name": name, "ramQuota": 100}
    form.update(_form(ram_quota, eviction_policy, max_ttl, compression_mode,
                      durability_min_level, replicas, flush))
    if conflict_resolution is not None:
        form["conflictResolutionType"] = conflict_resolution.value
    if num_vbuckets is not None:
        form["numVBuckets"] = num_vbuckets
    opts = conn_args.options()
    _call(_rest(opts, rest_port), "POST", _path(), form)
    _done("created", name, json_out)


@bucket_app.command("edit")
@connection_options(timeout=True)
def edit(
    name: NameArg,
    ram_quota: RamOpt = None,
    eviction_policy: EvictionOpt = None,
    max_ttl: MaxTtlOpt = None,
    compression_mode: CompressionOpt = None,
    durability_min_level: DurabilityOpt = None,
    replicas: ReplicasOpt = None,
    flush: FlushOpt = None,
    rest_port: RestPortOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Change a bucket's settings (not its name, conflict resolution or vbucket count). A
    new eviction policy or RAM quota restarts the bucket: its connections are closed.

    Example: dcptool bucket edit travel --max-ttl 3600
    """
    form = _form(ram_quota, eviction_policy, max_ttl, compression_mode,
                 durability_min_level, replicas, flush)
    if not form:
        from dcptool.errors import UsageError

        raise UsageError("nothing to change: give at least one setting")
    opts = conn_args.options()
    _call(_rest(opts, rest_port), "POST", _path(name), form)
    _done("edited", name, json_out)


@bucket_app.command("drop")
@connection_options(timeout=True)
def drop(
    name: NameArg,
    rest_port: RestPortOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Drop a bucket: its documents and files are removed, its connections closed.

    Example: dcptool bucket drop travel
    """
    opts = conn_args.options()
    _call(_rest(opts, rest_port), "DELETE", _path(name))
    _done("dropped", name, json_out)
