"""`dcptool doc`: write, read and delete documents with plain memcached commands.

Handy for trying dcptool out (the README tour writes its documents with it) and for
checking what a restore wrote. The key's vbucket is computed the way Couchbase clients do
(CRC32 of the key, modulo the bucket's vbucket count). -c may name a node alone or any
member of a cluster: the cluster map is read from it and each key goes to the member where
its vbucket is active (`dcptool.client.routing.Router`); a request answered NOT_MY_VBUCKET
(a move), or whose member cannot be reached (a failover under way), goes again to the
active the new map names. `doc load` writes pipelined, to every member in parallel.
"""
from __future__ import annotations

import base64
import json
import sys
import time
from typing import Annotated, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import console, print_json
from dcptool.client.privileges import READ, WRITE, check_privileges
from dcptool.errors import DcptoolError, UsageError


manual(
    "doc",
    exit_note="1 when get or delete finds no such document, or the user lacks the privilege "
              "(Read to get, Write to set, delete and load).",
    see_also=("node", "tail"),
)


doc_app = typer.Typer(
    name="doc",
    help="""Write, read and delete documents on a node or a cluster (set, get, delete, load).

    -c names a node alone or any member of a cluster: each key goes to the member that
    holds its vbucket active, and again to the new one after a move or a failover (for up
    to --timeout seconds without a write getting through).

    Example: dcptool doc set airline_10 '{"name": "40-Mile Air"}' -c 127.0.0.1:11210
    """,
    no_args_is_help=True,
)
app.add_typer(doc_app, name="doc")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
CollectionOpt = Annotated[Optional[str], typer.Option(
    "--collection", metavar="SCOPE.COLLECTION", envvar="DCPTOOL_COLLECTION",
    help="The document's collection (default: the default collection, _default._default).")]


def _open(opts, collection: Optional[str]):
    """(connection, key prefix): a plain connection and b"" for the default collection,
    else a collections connection and the collection id's LEB128 prefix."""
    if collection is None:
        return opts.connect(), b""
    parts = collection.split(".")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"--collection '{collection}' is not SCOPE.COLLECTION")
    from dcptool.client.ops import get_collections_manifest
    from dcptool.protocol.collections import encode_leb128

    conn = opts.connect(collections=True)
    try:
        if not conn.collections:
            if tuple(parts) == ("_default", "_default"):
                return conn, b""
            raise DcptoolError(f"{conn.address} has no collections (it refused HELLO "
                               f"Collections): only _default._default is there")
        found = get_collections_manifest(conn).collection(*parts)
        if found is None:
            raise DcptoolError(f"no collection {collection} in bucket {opts.bucket} on "
                               f"{conn.address}", hint="dcptool collection list shows them")
    except BaseException:
        conn.close()
        raise
    return conn, encode_leb128(found.uid)


def _vbuckets(conn) -> int:
    from dcptool.pipeline.nodeinfo import vbucket_count

    n = vbucket_count(conn)
    if n <= 0:
        raise DcptoolError(f"{conn.address} reports no vbuckets")
    return n


def _route(opts, collection: Optional[str]):
    """(router, key prefix, vbucket count): the routes of the bucket as the cluster map of
    the node given says, over the connection `_open` made."""
    from dcptool.client.routing import Router

    conn, prefix = _open(opts, collection)
    try:
        router = Router(opts, conn, collections=collection is not None,
                        reroute_seconds=opts.timeout)
        nvb = router.vbuckets or _vbuckets(conn)
    except BaseException:
        conn.close()
        raise
    if nvb <= 0:
        router.close()
        raise DcptoolError(f"{conn.address} reports no vbuckets")
    return router, prefix, nvb


def _check(rsp, what: str, key: str, address: str) -> None:
    from dcptool.client.connection import raise_for_status
    from dcptool.protocol.constants import Status

    if rsp.status == Status.KEY_ENOENT:
        raise DcptoolError(f"no document '{key}' on {address}")
    raise_for_status(rsp, what, address=address)


def _value_bytes(value: Optional[str], key: str) -> bytes:
    if value is None or value == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError(f"no value given for '{key}'",
                             hint="give it as the second argument or pipe it in")
        data = sys.stdin.buffer.read()
        if not data:
            raise UsageError(f"no value for '{key}' on standard input",
                             hint="give the value as the second argument")
        return data.rstrip(b"\n") if value is None else data
    return value.encode("utf-8")


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


@doc_app.command("set")
@connection_options(timeout=True)
def set_doc(
    key: Annotated[str, typer.Argument(help="Document key.", show_default=False)],
    value: Annotated[Optional[str], typer.Argument(
        help="The value: JSON is stored as JSON, anything else as raw bytes. '-' or no value: "
             "read it from standard input.", show_default=False)] = None,
    flags: Annotated[int, typer.Option("--flags", min=0, max=0xFFFFFFFF,
                                       help="Client flags stored with the document.")] = 0,
    expiry: Annotated[int, typer.Option("--expiry", min=0, metavar="SECONDS",
                                        help="Expire after SECONDS (0: never).")] = 0,
    collection: CollectionOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Create or replace one document.

    Example: dcptool doc set airline_10 '{"name": "40-Mile Air", "country": "United States"}'
    """
    from dcptool.protocol import Set, vbucket_of

    raw = _value_bytes(value, key)
    opts = conn_args.options()
    check_privileges(opts, "write documents in", WRITE)
    k = key.encode("utf-8")
    router, prefix, nvb = _route(opts, collection)
    with router:
        vb = vbucket_of(k, nvb)
        rsp, node = router.request(vb, Set(key=prefix + k, value=raw, flags=flags, expiry=expiry,
                                           vbucket=vb, datatype=1 if _is_json(raw) else 0),
                                   what="SET")
        _check(rsp, "SET", key, node)
    seqno = getattr(rsp, "mutation_seqno", None)
    out = {"key": key, "collection": collection or "_default._default", "vbucket": vb, "cas": rsp.cas,
           "seqno": seqno[1] if seqno else None, "bytes": len(raw)}
    if json_out:
        print_json(out)
    else:
        console().print(f"set {key} (vbucket {vb}, seqno {out['seqno']}, cas {rsp.cas})",
                        markup=False)


@doc_app.command("get")
@connection_options(timeout=True, snappy=True)
def get_doc(
    key: Annotated[str, typer.Argument(help="Document key.", show_default=False)],
    collection: CollectionOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Print one document's value (with --json: its value and metadata); exit status 1 if
    there is no such document. A value the node sends snappy-compressed is printed
    decompressed (and --json reports the datatype without the snappy bit).

    Example: dcptool doc get airline_10 --json
    """
    from dcptool.protocol import Get, ProtocolError, vbucket_of
    from dcptool.protocol.snappy import plain

    opts = conn_args.options()
    check_privileges(opts, "read documents in", READ)
    k = key.encode("utf-8")
    router, prefix, nvb = _route(opts, collection)
    with router:
        vb = vbucket_of(k, nvb)
        rsp, node = router.request(vb, Get(key=prefix + k, vbucket=vb), what="GET")
        _check(rsp, "GET", key, node)
    try:
        value, datatype = plain(rsp.value, rsp.datatype)
    except ProtocolError as exc:
        raise DcptoolError(f"{node} sent '{key}' snappy-compressed, but the value "
                           f"does not decompress: {exc.reason}") from None
    value = bytes(value)
    if not json_out:
        sys.stdout.buffer.write(value + (b"" if value.endswith(b"\n") else b"\n"))
        sys.stdout.flush()
        return
    out = {"key": key, "collection": collection or "_default._default", "vbucket": vb, "cas": rsp.cas, "flags": rsp.flags,
           "datatype": datatype}
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        out["value_base64"] = base64.b64encode(value).decode("ascii")
    else:
        out["value"] = json.loads(text) if datatype & 1 and _is_json(value) else text
    print_json(out)


@doc_app.command("delete")
@connection_options(timeout=True)
def delete_doc(
    key: Annotated[str, typer.Argument(help="Document key.", show_default=False)],
    collection: CollectionOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Delete one document (the node keeps a tombstone that DCP and backups see); exit
    status 1 if there is no such document.

    Example: dcptool doc delete user::7
    """
    from dcptool.protocol import Delete, vbucket_of

    opts = conn_args.options()
    check_privileges(opts, "delete documents in", WRITE)
    k = key.encode("utf-8")
    router, prefix, nvb = _route(opts, collection)
    with router:
        vb = vbucket_of(k, nvb)
        rsp, node = router.request(vb, Delete(key=prefix + k, vbucket=vb), what="DELETE")
        _check(rsp, "DELETE", key, node)
    seqno = getattr(rsp, "mutation_seqno", None)
    out = {"key": key, "collection": collection or "_default._default", "vbucket": vb, "cas": rsp.cas, "seqno": seqno[1] if seqno else None}
    if json_out:
        print_json(out)
    else:
        console().print(f"deleted {key} (vbucket {vb}, seqno {out['seqno']})", markup=False)


def _sample(i: int, prefix: str) -> bytes:
    return json.dumps({"id": i, "name": f"{prefix}{i}", "kind": "sample",
                       "created": int(time.time())}).encode()


@doc_app.command("load")
@connection_options(timeout=True)
def load_docs(
    count: Annotated[int, typer.Option("--count", min=1, help="How many documents.")] = 1000,
    prefix: Annotated[str, typer.Option("--prefix", help="Key prefix; keys are PREFIX0, "
                                                          "PREFIX1, ...")] = "doc::",
    start: Annotated[int, typer.Option("--start", min=0, help="Number of the first key.")] = 0,
    collection: CollectionOpt = None,
    conn_args: ConnArgs = None,
    json_out: JsonOpt = False,
) -> None:
    """Write COUNT small JSON sample documents (pipelined, thousands per second). On a
    cluster every member is written in parallel, each key to the member where its vbucket
    is active.

    Example: dcptool doc load --count 1000 --prefix user::
    """
    from dcptool.client.routing import failure_text
    from dcptool.protocol import Set, vbucket_of

    opts = conn_args.options()
    check_privileges(opts, "write documents in", WRITE)
    t0 = time.monotonic()
    router, pfx, nvb = _route(opts, collection)

    def items():
        for i in range(start, start + count):
            k = f"{prefix}{i}".encode("utf-8")
            vb = vbucket_of(k, nvb)
            f = Set(key=pfx + k, value=_sample(i, prefix), vbucket=vb, datatype=1).to_frame()
            f.opaque = i & 0xFFFFFFFF
            yield i, vb, f.encode()

    def name(i: int) -> str:
        return f"{prefix}{i}"

    with router:
        done = router.write(items(), window=1000, name=name)
        # the members written to (one failed over during the load counts: it took writes)
        members = len(done.nodes) or len(router.members)
    if done.failed:
        raise DcptoolError(failure_text(done.failed, name))
    seconds = time.monotonic() - t0
    out = {"count": count, "first": f"{prefix}{start}", "last": f"{prefix}{start + count - 1}",
           "seconds": round(seconds, 3), "members": members, "resent": done.resent}
    if json_out:
        print_json(out)
    else:
        where = opts.address if members == 1 else f"{members} members through {opts.address}"
        console().print(f"loaded {count} documents ({out['first']} .. {out['last']}) into "
                        f"{where} in {seconds:.1f} s", markup=False)
