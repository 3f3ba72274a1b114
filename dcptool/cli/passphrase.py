"""The archive passphrase on the command line: `--passphrase-file` on every command that
takes an ARCHIVE, never a passphrase value.

A passphrase comes from --passphrase-file PATH (or DCPTOOL_ARCHIVE_PASSPHRASE_FILE), then
--passphrase-command COMMAND (the first line it prints), then DCPTOOL_ARCHIVE_PASSPHRASE,
then DCPTOOL_ARCHIVE_PASSPHRASE_COMMAND, then a prompt when a terminal is attached
(see dcptool.archive.crypto.get_passphrase). It is never printed or logged.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dcptool.archive import crypto
from dcptool.errors import UsageError


def _passphrase_file_option() -> Any:
    def proto(
        passphrase_file: Annotated[Optional[Path], typer.Option(
            "--passphrase-file", metavar="PATH", envvar=crypto.PASSPHRASE_FILE_ENV,
            show_default=False,
            help="Read the passphrase of an encrypted archive from the first line of this "
                 "file (else DCPTOOL_ARCHIVE_PASSPHRASE, else a prompt on the terminal).")] = None,
    ) -> None:  # pragma: no cover
        pass

    t = typer.Typer(add_completion=False)
    t.command()(proto)
    return typer.main.get_command(t).params[0]


def _passphrase_command_option() -> Any:
    def proto(
        passphrase_command: Annotated[Optional[str], typer.Option(
            "--passphrase-command", metavar="COMMAND", show_default=False,
            help="Run COMMAND (split like a shell would, no shell) and use the first line it "
                 "prints as the passphrase, e.g. a secret manager's CLI (else "
                 "DCPTOOL_ARCHIVE_PASSPHRASE_COMMAND after the other sources).")] = None,
    ) -> None:  # pragma: no cover
        pass

    t = typer.Typer(add_completion=False)
    t.command()(proto)
    return typer.main.get_command(t).params[0]


def add_passphrase_file(cmd: Any) -> None:
    """Give a command whose argument is an archive a --passphrase-file option (once)."""
    params = getattr(cmd, "params", None)
    if not params or cmd.callback is None or getattr(cmd, "_dcptool_passphrase_file", False):
        return
    names = [p.name for p in params]
    if "passphrase_file" in names or not any(
            p.name == "archive" and getattr(p, "param_type_name", "") == "argument"
            for p in params):
        return
    cmd._dcptool_passphrase_file = True
    params.append(_passphrase_file_option())
    params.append(_passphrase_command_option())
    inner = cmd.callback

    @functools.wraps(inner)
    def callback(*args, **kwargs):
        path = kwargs.pop("passphrase_file", None)
        command = kwargs.pop("passphrase_command", None)
        if path is not None and command is not None:
            from dcptool.cli.connopts import get_current_context

            ctx = get_current_context(silent=True)
            src = ctx.get_parameter_source("passphrase_file") if ctx is not None else None
            if src is not None and src.name == "COMMANDLINE":
                raise UsageError("give --passphrase-file or --passphrase-command, not both")
            path = None  # the file came from its variable: the command line's command wins
        crypto.set_passphrase_file(path)
        crypto.set_passphrase_command(command)
        return inner(*args, **kwargs)

    cmd.callback = callback
