"""`dcptool collection`: list, create and drop scopes and collections of a bucket.

Through the node's REST port (Couchbase's `/pools/default/buckets/NAME/scopes` endpoints), as
`couchbase-cli collection-manage` does: the KV protocol has no command to change them. The
REST port comes from the node's cluster config (its `mgmt` port), or `--rest-port`.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import console, print_json
from dcptool.errors import DcptoolError, UsageError

manual(
    "collection",
    exit_note="1 when the node refuses the change (the scope or collection exists, or does "
              "not, or the user may not manage collections).",
    see_also=("doc", "backup", "restore"),
)

collection_app = typer.Typer(
    name="collection",
    help="""List, create and drop a bucket's scopes and collections (over its REST port).

    Example: dcptool collection create inventory.hotels --max-ttl 86400
    """,
    no_args_is_help=True,
)
app.add_typer(collection_app, name="collection")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
RestPortOpt = Annotated[Optional[int], typer.Option(
    "--rest-port", metavar="PORT", envvar="DCPTOOL_REST_PORT", min=1, max=65535,
    help="The node's REST port (default: the management port its cluster config names).")]
PathArg = Annotated[str, typer.Argument(
    metavar="SCOPE[.COLLECTION]", show_default=False,
    help="A scope, or a collection as SCOPE.COLLECTION.")]


def _split(path: str) -> tuple[str, str | None]:
    parts = path.split(".")
    if len(parts) > 2 or not all(parts):
        raise UsageError(f"'{path}' is not SCOPE or SCOPE.COLLECTION")
    return parts[0], parts[1] if len(parts) == 2 else None


def _rest(opts, rest_port: int | None):
    from dcptool.client.rest import rest_client_for

    return rest_client_for(opts, rest_port, select_bucket=True)


def _call(fn, *args):
    from dcptool.client.rest import RestError

    try:
        return fn(*args)
    except RestError as exc:
        hint = ("the user needs a role that manages collections (admin, scope_admin)"
                if exc.forbidden else None)
        raise DcptoolError(str(exc), hint=hint) from None


@collection_app.command("list")
@connection_options(timeout=True)
def list_collections(
    rest_port: RestPortOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """List the bucket's scopes and collections with their ids and max TTLs (--json: the
    manifest as the REST API returns it).

    Example: dcptool collection list --json
    """
    opts = conn_args.options()
    man = _call(_rest(opts, rest_port).manifest)
    if json_out:
        print_json(man.to_json())
        return
    out = console()
    out.print(f"manifest uid {man.uid:#x}: {len(man.scopes)} scopes, "
              f"{man.num_collections} collections", markup=False)
    for s in man.scopes:
        out.print(f"{s.name} (scope {s.uid:#x})", markup=False)
        for c in s.collections:
            ttl = f", max TTL {c.max_ttl} s" if c.max_ttl else ""
            out.print(f"  {s.name}.{c.name} (collection {c.uid:#x}{ttl})", markup=False)


@collection_app.command("create")
@connection_options(timeout=True)
def create(
    path: PathArg,
    max_ttl: Annotated[int, typer.Option(
        "--max-ttl", min=0, max=0x7FFFFFFF, metavar="SECONDS",
        help="A collection's maximum TTL: documents expire at most this long after they are "
             "written (0: no limit).")] = 0,
    rest_port: RestPortOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a scope, or a collection (SCOPE.COLLECTION) in an existing scope.

    Example: dcptool collection create inventory.hotels
    """
    scope, coll = _split(path)
    if coll is None and max_ttl:
        raise UsageError("--max-ttl applies to a collection, not to a scope")
    opts = conn_args.options()
    rest = _rest(opts, rest_port)
    uid = (_call(rest.create_scope, scope) if coll is None
           else _call(rest.create_collection, scope, coll, max_ttl))
    _done("created", path, uid, json_out)


@collection_app.command("drop")
@connection_options(timeout=True)
def drop(
    path: PathArg,
    rest_port: RestPortOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Drop a collection (SCOPE.COLLECTION), or a scope with all its collections. Their
    documents disappear at once and are purged by compaction; backups record the drop.

    Example: dcptool collection drop inventory.hotels
    """
    scope, coll = _split(path)
    opts = conn_args.options()
    rest = _rest(opts, rest_port)
    uid = (_call(rest.drop_scope, scope) if coll is None
           else _call(rest.drop_collection, scope, coll))
    _done("dropped", path, uid, json_out)


def _done(what: str, path: str, uid: int | None, json_out: bool) -> None:
    if json_out:
        print_json({what: path, "manifest_uid": None if uid is None else format(uid, "x")})
    else:
        tail = "" if uid is None else f" (manifest uid {uid:#x})"
        console().print(f"{what} {path}{tail}", markup=False)
