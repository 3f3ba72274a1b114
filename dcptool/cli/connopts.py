"""Connection options shared by every command that talks to a node.

A command gets the whole set by name, once: `@connection_options(...)` replaces the
command's `conn_args: ConnArgs` parameter with -c/--cluster, -u, -p, -b, --cacert,
--no-verify (and, when asked, --timeout and --snappy), and the command receives them as
one `ConnArgs`, which turns into a checked `ConnOptions` when the command needs it:

    @app.command()
    @connection_options(timeout=True)
    def watermark(name: str, conn_args: ConnArgs = None):
        opts = conn_args.options()
        with opts.connect() as conn:
            ...

The password comes from -p, --password-file FILE (its first line), DCPTOOL_PASSWORD,
DCPTOOL_PASSWORD_FILE, or a prompt when stdin is a terminal, in that order; it is never
printed. Commands do not declare --password-file: `add_password_file(cmd)` (run over the
whole command tree by the app) gives it to every command with -p/--password and turns it
into the `password` argument before the command runs. `ConnOptions` is picklable (it holds
no socket or SSL context), so a Spark driver can ship it to its tasks.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dcptool.client import options
from dcptool.errors import UsageError
from dcptool.client.options import (CLIENT_CERT_ENV, CLIENT_KEY_ENV,
                                    CLIENT_KEY_PASSPHRASE_FILE_ENV, DEFAULT_SNAPPY,
                                    PASSWORD_COMMAND_ENV, PASSWORD_FILE_ENV, SNAPPY_ENV,
                                    ConnOptions)

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.globals import get_current_context  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - older typer
    from click import get_current_context  # type: ignore[no-redef]

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
    help="Password; better use --password-file or DCPTOOL_PASSWORD (a command line is "
         "visible to other users), or leave it out to be prompted on a terminal.")]
PasswordFileOpt = Annotated[Optional[Path], typer.Option(
    "--password-file", envvar=PASSWORD_FILE_ENV, metavar="FILE", rich_help_panel=PANEL,
    show_default=False,
    help="Read the password from FILE's first line (keep FILE mode 0600).")]
PasswordCommandOpt = Annotated[Optional[str], typer.Option(
    "--password-command", envvar=PASSWORD_COMMAND_ENV, metavar="COMMAND", rich_help_panel=PANEL,
    show_default=False,
    help="Run COMMAND (split like a shell would, no shell) and use the first line it prints "
         "as the password, e.g. a secret manager's CLI.")]
ClientCertOpt = Annotated[Optional[Path], typer.Option(
    "--client-cert", envvar=CLIENT_CERT_ENV, metavar="FILE", rich_help_panel=PANEL,
    show_default=False,
    help="Client certificate (PEM; the key too unless --client-key) for couchbases://: the "
         "node logs in the user the certificate names, no password needed.")]
ClientKeyOpt = Annotated[Optional[Path], typer.Option(
    "--client-key", envvar=CLIENT_KEY_ENV, metavar="FILE", rich_help_panel=PANEL,
    show_default=False, help="Private key (PEM) of --client-cert.")]
ClientKeyPassOpt = Annotated[Optional[Path], typer.Option(
    "--client-key-passphrase-file", envvar=CLIENT_KEY_PASSPHRASE_FILE_ENV, metavar="FILE",
    rich_help_panel=PANEL, show_default=False,
    help="Read the passphrase of an encrypted --client-key from FILE's first line.")]
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
SnappyOpt = Annotated[Optional[bool], typer.Option(
    "--snappy/--no-snappy", envvar=SNAPPY_ENV, rich_help_panel=PANEL, show_default=False,
    help="Negotiate Snappy and ask the node to send every value compressed: fewer bytes on "
         "the wire, more CPU on both ends (default "
         + ("on" if DEFAULT_SNAPPY else "off") + "; it pays on a slow network). "
         "Compressed values are decompressed either way.")]


@dataclass(frozen=True)
class ConnArgs:
    """The connection options as the command line gave them; `options()` checks them."""

    cluster: str | None = None
    username: str | None = None
    password: str | None = None
    bucket: str | None = "default"
    cacert: Path | None = None
    no_verify: bool = False
    timeout: float = 10.0
    snappy: bool | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    client_key_passphrase_file: Path | None = None

    def options(self, cluster: str | None = ..., *, bucket: str | None = ...) -> ConnOptions:
        """The checked `ConnOptions` (another node or bucket when given)."""
        return ConnOptions.from_cli(self.cluster if cluster is ... else cluster, self.username,
                                    self.password, self.bucket if bucket is ... else bucket,
                                    self.cacert, self.no_verify, self.timeout,
                                    snappy=self.snappy, client_cert=self.client_cert,
                                    client_key=self.client_key,
                                    client_key_passphrase_file=self.client_key_passphrase_file)


#: the parameters `connection_options` adds, in their order, with their defaults
_CONN_PARAMS = (
    ("cluster", ClusterOpt, None),
    ("username", UsernameOpt, None),
    ("password", PasswordOpt, None),
    ("bucket", BucketOpt, "default"),
    ("cacert", CacertOpt, None),
    ("no_verify", NoVerifyOpt, False),
    ("timeout", TimeoutOpt, 10.0),
    ("snappy", SnappyOpt, None),
    ("client_cert", ClientCertOpt, None),
    ("client_key", ClientKeyOpt, None),
    ("client_key_passphrase_file", ClientKeyPassOpt, None),
)
_CONN_ARG = "conn_args"


def connection_options(*, cluster: Any = ClusterOpt, bucket: Any = BucketOpt,
                       bucket_default: str | None = "default", timeout: bool = False,
                       snappy: bool = False):
    """Give a command the connection options in place of its `conn_args` parameter.

    `cluster`: the -c/--cluster declaration (None: the command declares its own -c and
    `ConnArgs.cluster` is None); `bucket`, `bucket_default`: the -b/--bucket declaration;
    `timeout`, `snappy`: whether the command takes --timeout and --snappy (without them
    `ConnArgs` holds their defaults).
    """
    wanted = {"cluster": cluster is not None, "timeout": timeout, "snappy": snappy}
    annotations = {"cluster": cluster, "bucket": bucket}
    defaults = {"bucket": bucket_default}

    def decorate(fn):
        sig = inspect.signature(fn, eval_str=True)
        names = list(sig.parameters)
        if _CONN_ARG not in names:
            raise TypeError(f"{fn.__name__}: no {_CONN_ARG} parameter to replace")
        kind = sig.parameters[_CONN_ARG].kind
        added = [inspect.Parameter(name, kind, annotation=annotations.get(name, ann),
                                   default=defaults.get(name, default))
                 for name, ann, default in _CONN_PARAMS if wanted.get(name, True)]
        at = names.index(_CONN_ARG)
        params = list(sig.parameters.values())
        params[at:at + 1] = added
        own = {p.name for p in added}

        @functools.wraps(fn)
        def command(*args, **kwargs):
            given = {name: kwargs.pop(name) for name in list(kwargs) if name in own}
            kwargs[_CONN_ARG] = ConnArgs(**given)
            return fn(*args, **kwargs)

        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        if sig.return_annotation is not inspect.Signature.empty:
            command.__annotations__["return"] = sig.return_annotation
        return command

    return decorate


def _option(name: str, ann: Any):
    """A fresh click option built by typer from an `Annotated` declaration."""
    def proto(value: ann = None) -> None:  # pragma: no cover
        pass

    proto.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ann,
                           default=None)])
    proto.__annotations__ = {name: ann}
    t = typer.Typer(add_completion=False)
    t.command()(proto)
    return next(p for p in typer.main.get_command(t).params if p.name == name)


def _password_file_option():
    """A fresh click option for --password-file, built by typer from `PasswordFileOpt`."""
    return _option("password_file", PasswordFileOpt)


def add_password_file(cmd: Any) -> None:
    """Give a command with -p/--password the --password-file and --password-command options
    (once).

    Precedence: -p, --password-file, --password-command on the command line (two of them
    together are a usage error), then DCPTOOL_PASSWORD, DCPTOOL_PASSWORD_FILE,
    DCPTOOL_PASSWORD_COMMAND.
    """
    params = getattr(cmd, "params", None)
    if not params or cmd.callback is None or getattr(cmd, "_dcptool_password_file", False):
        return
    names = [p.name for p in params]
    if "password" not in names or "password_file" in names:
        return
    pw = params[names.index("password")]
    if "-p" not in getattr(pw, "opts", ()):
        return
    cmd._dcptool_password_file = True
    at = names.index("password") + 1
    params[at:at] = [_password_file_option(),
                     _option("password_command", PasswordCommandOpt)]
    inner = cmd.callback

    @functools.wraps(inner)
    def callback(*args, **kwargs):
        path = kwargs.pop("password_file", None)
        command = kwargs.pop("password_command", None)
        if path is not None or command is not None:
            kwargs["password"] = choose_password(kwargs.get("password"), path, command)
        return inner(*args, **kwargs)

    cmd.callback = callback


def choose_password(password: str | None, path: Path | None,
                    command: str | None = None) -> str:
    """The password a command runs with when --password-file or --password-command (or
    their variables) is set: the first given of -p, --password-file, --password-command on
    the command line, then of DCPTOOL_PASSWORD, DCPTOOL_PASSWORD_FILE,
    DCPTOOL_PASSWORD_COMMAND."""
    ctx = get_current_context(silent=True)

    def on_cli(name: str) -> bool:
        if ctx is None:
            return False
        src = ctx.get_parameter_source(name)
        return src is not None and src.name == "COMMANDLINE"

    given = {"password": password, "password_file": path, "password_command": command}
    cli = [n for n, v in given.items() if v is not None and on_cli(n)]
    if len(cli) > 1:
        flags = ["--" + n.replace("_", "-") for n in cli]
        raise UsageError(f"give {' or '.join(flags)}, not "
                         + ("both" if len(flags) == 2 else "more than one"))
    order = cli + [n for n, v in given.items() if v is not None and n not in cli]
    first = order[0]
    if first == "password":
        return password
    if first == "password_file":
        label = "--password-file" if on_cli("password_file") or ctx is None \
            else PASSWORD_FILE_ENV
        return options.read_password_file(path, what=label)
    label = "--password-command" if on_cli("password_command") else PASSWORD_COMMAND_ENV
    return options.run_secret_command(command, what=label)
