"""The typer application and the entry point that turns errors into one line."""
from __future__ import annotations

import sys

import click
import typer

from dcptool import __version__
from dcptool.errors import DcptoolError

app = typer.Typer(
    name="dcptool",
    help="Back up, restore and inspect Couchbase-style data nodes through DCP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"dcptool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Back up, restore and inspect Couchbase-style data nodes through DCP."""


def _register() -> None:
    from dcptool.cli import decode  # noqa: F401  (registers its commands)
    from dcptool.cli import node  # noqa: F401
    from dcptool.cli import failover_log  # noqa: F401
    from dcptool.cli import tail  # noqa: F401
    from dcptool.cli import info, verify  # noqa: F401
    from dcptool.cli import backup  # noqa: F401  (backup, restore)
    from dcptool.cli import quickstart  # noqa: F401
    from dcptool.cli import merge  # noqa: F401
    from dcptool.cli import export  # noqa: F401
    from dcptool.cli import examine  # noqa: F401


_register()


def error_line(message: str, hint: str | None = None) -> None:
    line = f"dcptool: error: {message}"
    if hint:
        line += f" (hint: {hint})"
    print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every user error ends as one line on stderr and a meaningful exit code."""
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=argv, prog_name="dcptool", standalone_mode=False)
    except DcptoolError as exc:
        error_line(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        sys.exit(2)
    except click.UsageError as exc:
        hint = None
        if exc.ctx is not None:
            hint = f"see '{exc.ctx.command_path} --help'"
        error_line(exc.format_message(), hint)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        error_line("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        error_line(exc.format_message())
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(141)
    sys.exit(rc if isinstance(rc, int) else 0)
