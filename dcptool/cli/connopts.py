"""Connection options shared by every command that talks to a node.

A command declares the options with the annotated types below and turns them into
a `ConnOptions` with `ConnOptions.from_cli(...)`:

    @app.command()
    def watermark(cluster: ClusterOpt = None, username: UsernameOpt = None,
                  password: PasswordOpt = None, bucket: BucketOpt = "default",
                  cacert: CacertOpt = None, no_verify: NoVerifyOpt = False):
        opts = ConnOptions.from_cli(cluster, username, password, bucket, cacert, no_verify)
        with opts.connect() as conn:
            ...

The password comes from -p, DCPTOOL_PASSWORD, or a prompt when stdin is a terminal;
it is never printed. `ConnOptions` is picklable (it holds no socket or SSL context),
so a Spark driver can ship it to its tasks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dcptool.client.options import DEFAULT_USERNAME, ConnOptions  # noqa: F401  (re-exported)

PANEL = "Connection"

ClusterOpt = Annotated[Optional[str], typer.Option(
    "-c", "--cluster", envvar="DCPTOOL_CLUSTER", metavar="URL", rich_help_panel=PANEL,
    help="Node address: couchbase://HOST[:PORT], couchbases://HOST[:PORT] (TLS) or HOST:PORT "
         "(default port 11210, 11207 for couchbases).")]
UsernameOpt = Annotated[Optional[str], typer.Option(
    "-u", "--username", envvar="DCPTOOL_USERNAME", rich_help_panel=PANEL,
    help="User name (default Administrator).")]
PasswordOpt = Annotated[Optional[str], typer.Option(
    "-p", "--password", envvar="DCPTOOL_PASSWORD", rich_help_panel=PANEL, show_default=False,
    help="Password; better set DCPTOOL_PASSWORD, or leave it out to be prompted on a terminal.")]
BucketOpt = Annotated[str, typer.Option(
    "-b", "--bucket", envvar="DCPTOOL_BUCKET", rich_help_panel=PANEL,
    help="Bucket name.")]
CacertOpt = Annotated[Optional[Path], typer.Option(
    "--cacert", rich_help_panel=PANEL, metavar="FILE",
    help="CA certificate (PEM) to trust for couchbases://.")]
NoVerifyOpt = Annotated[bool, typer.Option(
    "--no-verify", rich_help_panel=PANEL,
    help="Do not verify the node's TLS certificate (couchbases:// only).")]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", rich_help_panel=PANEL, metavar="SECONDS",
    help="Seconds to wait for the node to answer.")]



