"""The archive passphrase on the command line: `--passphrase-file` on every command that
takes an ARCHIVE, never a passphrase value.

A passphrase comes from --passphrase-file PATH (or DCPTOOL_ARCHIVE_PASSPHRASE_FILE), then
--passphrase-command COMMAND (the first line it prints), then DCPTOOL_ARCHIVE_PASSPHRASE,
then DCPTOOL_ARCHIVE_PASSPHRASE_COMMAND, then a prompt when a terminal is attached
(see dcptool.archive.crypto.get_passphrase). It is never printed or logged.

The options given are kept for the command being run (in its click context), and
`open_archive` opens the command's archive once with them: the opened archive (its data
key with it) is what the command passes on.
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


#: where a command's --passphrase-file / --passphrase-command are kept (click context meta)
_SOURCE = "dcptool.passphrase_source"


def passphrase_source() -> crypto.PassphraseSource | None:
    """The --passphrase-file / --passphrase-command of the command being run (None when
    it was given neither, or outside a command)."""
    from dcptool.cli.connopts import get_current_context

    ctx = get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_SOURCE)


def open_archive(path: Any) -> Any:
    """The command's archive, opened once: an encrypted one unlocked with the passphrase
    its options, the environment or the prompt give (a wrong passphrase is one line here,
    before any work). The command passes the result on, never the path again."""
    from dcptool.archive import Archive

    return Archive.open(path, passphrase=passphrase_source())


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
        from dcptool.cli.connopts import get_current_context

        ctx = get_current_context(silent=True)
        if ctx is not None:
            ctx.meta[_SOURCE] = crypto.PassphraseSource(
                None if path is None else str(path), command or None)
        return inner(*args, **kwargs)

    cmd.callback = callback
