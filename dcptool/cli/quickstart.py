"""`dcptool quickstart`: the whole main job on one machine, with the embedded defaults."""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Annotated

import typer

from dcptool.cli.app import app
from dcptool.cli.manual import manual
from dcptool.cli.output import console


manual(
    "quickstart",
    files=(
        ("DIR/", "The two nodes' directories (node-a, node-b) and the archive."),
    ),
    see_also=("node", "backup", "restore", "info"),
)


@app.command()
def quickstart(
    directory: Annotated[Path, typer.Option("--dir", metavar="DIR",
                                            help="Working directory for the nodes and "
                                                 "the archive.")] = Path("dcptool-quickstart"),
    docs: Annotated[int, typer.Option("--docs", min=1, help="Sample documents to load.")] = 10_000,
    vbuckets: Annotated[int, typer.Option("--vbuckets", min=1, max=1024,
                                          help="vbuckets of the local nodes.")] = 64,
    master: Annotated[str, typer.Option("--master", metavar="URL",
                                        help="Spark master URL.")] = "local[*]",
    json_out: Annotated[bool, typer.Option("--json", help="Print what each step did as one "
                                                          "JSON object (no progress lines).")] = False,
) -> None:
    """Try dcptool end to end: start a local node, load sample documents, back up, change
    data, back up incrementally, restore into a second node and show the archive.

    Everything runs on this machine: two reference nodes on 127.0.0.1 and local Spark.

    Example: dcptool quickstart --dir /tmp/dcptool-demo --docs 20000
    """
    from dcptool.client.options import ConnOptions
    from dcptool.node.launcher import LocalNode
    from dcptool.pipeline.backup import run_backup
    from dcptool.pipeline.restore import run_restore
    from dcptool.pipeline.runtime import get_spark
    from dcptool.protocol import Delete, Set, vbucket_of

    out = console()
    report: dict = {}

    def step(text: str) -> None:
        if not json_out:
            out.print(text)

    directory = directory.absolute()
    archive = directory / "archive"
    if archive.exists():
        import shutil
        shutil.rmtree(archive)
    password = secrets.token_urlsafe(12)

    def send_all(conn, msgs) -> None:
        buf = bytearray()
        for i, m in enumerate(msgs):
            f = m.to_frame()
            f.opaque = i
            buf += f.encode()
        conn.send_bytes(buf)
        for _ in msgs:
            conn.recv_frame(timeout=60)

    with LocalNode(directory / "node-a", password=password, vbuckets=vbuckets) as a, \
            LocalNode(directory / "node-b", password=password, vbuckets=vbuckets) as b:
        step(f"[bold]1.[/bold] started node A on {a.address} and node B on {b.address}")
        report["nodes"] = {"a": a.address, "b": b.address}
        src = ConnOptions(a.host, a.port, "Administrator", password)
        dst = ConnOptions(b.host, b.port, "Administrator", password)
        with src.connect() as conn:
            for i in range(0, docs, 5000):
                send_all(conn, [Set(key=k, value=json.dumps({"id": j, "kind": "sample",
                                                               "created": int(time.time())}).encode(),
                                    vbucket=vbucket_of(k, vbuckets), datatype=1)
                                for j in range(i, min(docs, i + 5000)) for k in [f"sample::{j}".encode()]])
        step(f"[bold]2.[/bold] loaded {docs} sample documents into node A")
        report["loaded"] = docs
        spark = get_spark(master)
        r1 = run_backup(src, archive, spark=spark)
        step(f"[bold]3.[/bold] full backup {r1.backup_id}: {r1.mutations} mutations "
             f"in {r1.seconds:.1f}s")
        changed = max(1, docs // 10)
        with src.connect() as conn:
            send_all(conn, [Set(key=k, value=json.dumps({"id": j, "kind": "updated"}).encode(),
                                vbucket=vbucket_of(k, vbuckets), datatype=1)
                            for j in range(changed) for k in [f"sample::{j}".encode()]])
            send_all(conn, [Delete(key=k, vbucket=vbucket_of(k, vbuckets))
                            for j in range(changed, 2 * changed) if j < docs
                            for k in [f"sample::{j}".encode()]])
        step(f"[bold]4.[/bold] updated {changed} and deleted {min(changed, docs - changed)} documents")
        report["changed"] = {"updated": changed, "deleted": min(changed, docs - changed)}
        r2 = run_backup(src, archive, spark=spark)
        step(f"[bold]5.[/bold] incremental backup {r2.backup_id}: {r2.mutations} mutations, "
             f"{r2.deletions} deletions")
        rr = run_restore(str(archive), dst, spark=spark).as_dict()
        report["backups"] = [r1.as_dict(), r2.as_dict()]
        step(f"[bold]6.[/bold] restored into node B: {rr['restored']['mutation']} documents, "
             f"{rr['restored']['deletion']} deletions")
        report["restore"] = rr
    if json_out:
        from dcptool.archive import Archive
        from dcptool.archive.info import describe_archive
        from dcptool.cli.output import print_json

        report["dir"] = str(directory)
        report["archive"] = describe_archive(Archive.open(archive))
        print_json(report, pretty=True)
        return
    out.print("[bold]7.[/bold] the archive (dcptool info):")
    from dcptool.cli.info import info as show_info

    show_info(archive, False)
    out.print(f"done: the nodes are stopped; their data and the archive are in {directory}")
