"""The typer application and the entry point that turns errors into one line.

Exit status (documented in docs/exit-codes.md and every man page):

    0    success
    1    failure: the work could not be done, or a check found problems
         (verify, decode, examine, restore with failed writes)
    2    usage error: bad options or arguments, no such archive, no password
    3    the archive is locked by another backup or merge: try again later
    4    tail --fail-on-rollback: the node asked for a rollback
    130  interrupted (Ctrl-C)
    141  standard output was closed early (for example piped into head)

Help texts are written as docstrings; `polish()` reflows them once for the whole tree
(single line breaks inside a paragraph are joined, "Example:" lines stay lines of their
own) and gives every option a metavar, so each command module only writes prose.
"""
from __future__ import annotations

import difflib
import errno
import inspect
import os
import re
import sys
import traceback
import types
from typing import Annotated, Any

import typer
import typer.core
from typer.core import TyperGroup

from dcptool import __version__
from dcptool.cli import output
from dcptool.errors import DcptoolError, Interrupted

try:  # typer >= 0.2x carries its own copy of click; older ones use click itself
    from typer import _click as _impl  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older typer
    import click as _impl  # type: ignore[no-redef]
try:
    import click as _click_pkg
except ImportError:  # pragma: no cover
    _click_pkg = None

_IMPLS = tuple(m for m in (_impl, _click_pkg) if m is not None)


def _exc(name: str) -> tuple[type[BaseException], ...]:
    out: list[type[BaseException]] = []
    for m in _IMPLS:
        cls = getattr(m.exceptions, name, None)
        if cls is not None and cls not in out:
            out.append(cls)
    return tuple(out)


_USAGE_ERRORS = _exc("UsageError")
_NO_ARGS_IS_HELP = _exc("NoArgsIsHelpError")
_CLICK_EXCEPTIONS = _exc("ClickException")
_EXITS = tuple({typer.Exit, *_exc("Exit")})
_ABORTS = tuple({typer.Abort, *_exc("Abort")})

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_ROLLBACK = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

#: (status, what it means) for the man pages and docs/exit-codes.md
EXIT_STATUS = (
    (EXIT_OK, "Success."),
    (EXIT_FAILURE, "Failure: the work could not be done (the node could not be reached, a "
                   "task failed, the user lacks a privilege the command needs, ...), or a "
                   "check found problems (verify, decode, examine). A missing privilege is "
                   "found before any work starts: one line names the user, the privilege and "
                   "the roles that grant it."),
    (EXIT_USAGE, "Usage error: bad options or arguments, no such archive, no password given."),
    (EXIT_LOCKED, "The archive is locked by another backup or merge, or (node start) a "
                  "running node holds the data directory; try again later."),
    (EXIT_ROLLBACK, "tail --fail-on-rollback: the node asked for a rollback."),
    (EXIT_INTERRUPTED, "Interrupted (Ctrl-C or SIGTERM where the command does not handle it)."),
    (EXIT_BROKEN_PIPE, "Standard output was closed early (for example piped into head)."),
)


# -- help texts: one reflow for the whole tree ---------------------------------------------

_OWN_LINE = re.compile(r"^(Example:|Examples:|- |\* |\d+\. )")


def reflow(text: str | None) -> str | None:
    """Join the single line breaks of docstring paragraphs; keep paragraphs, "Example:"
    lines and list items on lines of their own, and `\\b` (verbatim) paragraphs as they are."""
    if not text:
        return text
    text = inspect.cleandoc(text)
    head, sep, tail = text.partition("\f")
    paragraphs = re.split(r"\n\s*\n", head.strip())
    out = []
    for para in paragraphs:
        if para.startswith("\b"):
            out.append(para)
            continue
        lines: list[str] = []
        for raw in para.split("\n"):
            line = raw.strip()
            if lines and not _OWN_LINE.match(line) and not _OWN_LINE.match(lines[-1]):
                lines[-1] += " " + line
            else:
                lines.append(line)
        out.append("\n".join(lines))
    return "\n\n".join(out) + (sep + tail if sep else "")


def markup_safe(text: str | None) -> str | None:
    """A help text as rich's markup shows it: what looks like a markup tag escaped, so
    `data_backup[travel]` shows as written (scripts/docgen.py reads the texts back plain)."""
    if not text:
        return text
    from rich.markup import escape

    return escape(text)


def _is_flag(param: Any) -> bool:
    return bool(getattr(param, "is_flag", False) or getattr(param, "count", False))


def param_kind(param: Any) -> tuple[str, tuple[str, ...]]:
    """(kind, choices) of a parameter's value: kind is one of flag, int, float, path, file,
    dir, choice, text. Works with typer's own parameter types and with click's."""
    if _is_flag(param):
        return "flag", ()
    td = getattr(param, "type_descriptor", None)
    if td is not None:  # typer >= 0.2x
        choices = td.choices
        if choices:
            return "choice", tuple(str(getattr(c, "value", c)) for c in choices)
        if td.is_path:
            kind = str(td.path_type or "path").lower()
            return ("dir" if kind.startswith("dir") else "file" if kind == "file" else "path"), ()
        ann = td.annotation
        if ann is int:
            return "int", ()
        if ann is float:
            return "float", ()
        return "text", ()
    t = getattr(param, "type", None)
    choices = getattr(t, "choices", None)
    if choices:
        return "choice", tuple(str(getattr(c, "value", c)) for c in choices)
    name = getattr(t, "name", "")
    if name == "path" or type(t).__name__ == "Path":
        if getattr(t, "file_okay", True) is False:
            return "dir", ()
        return ("file" if getattr(t, "dir_okay", True) is False else "path"), ()
    if name in ("integer", "integer range"):
        return "int", ()
    if name in ("float", "float range"):
        return "float", ()
    return "text", ()


def value_metavar(param: Any) -> str:
    """The placeholder shown for an option's value or an argument: its metavar, else N for
    integers, the choices, or the parameter's name (`--bucket BUCKET`)."""
    if getattr(param, "metavar", None):
        return param.metavar
    kind, choices = param_kind(param)
    if kind == "int":
        return "N"
    if kind == "choice":
        return "|".join(choices)
    return (param.name or "value").upper()


def _usage_name(param: Any):
    def name() -> str:
        return param.metavar if param.required else f"[{param.metavar}]"
    return name


def polish(cmd: Any) -> None:
    """Reflow the help of `cmd` and everything under it; give arguments and valued options
    upper-case metavars and flags none; let sub-groups suggest commands like the root."""
    if getattr(cmd, "_dcptool_polished", False):
        return
    cmd._dcptool_polished = True
    from dcptool.cli.connopts import add_password_file
    from dcptool.cli.passphrase import add_passphrase_file

    add_password_file(cmd)  # every command with -p/--password also takes --password-file
    add_passphrase_file(cmd)  # every command with an ARCHIVE takes --passphrase-file
    add_trailing_verbosity(cmd)
    cmd.help = markup_safe(reflow(cmd.help))
    if getattr(cmd, "short_help", None):
        cmd.short_help = markup_safe(reflow(cmd.short_help))
    for p in getattr(cmd, "params", ()):
        if getattr(p, "help", None):
            p.help = markup_safe(reflow(p.help))
        if getattr(p, "param_type_name", "") == "argument":
            if not p.metavar:
                p.metavar = (p.name or "arg").upper()
            if hasattr(p, "_usage_display_name") and p.nargs == 1:
                p._usage_display_name = _usage_name(p)  # ARCHIVE, not typer's {ARCHIVE}
        elif _is_flag(p):
            p.metavar = ""
        elif not p.metavar:
            p.metavar = value_metavar(p)
    # every group suggests commands like the root; no command shows a type for --help
    if isinstance(cmd, TyperGroup) and not isinstance(cmd, DcptoolGroup):
        cmd.resolve_command = types.MethodType(DcptoolGroup.resolve_command, cmd)
    if not isinstance(cmd, _HelpOption):
        cmd.get_help_option = types.MethodType(_help_option_without_type, cmd)
    for sub in (getattr(cmd, "commands", None) or {}).values():
        polish(sub)


def _trailing_quiet(ctx: Any, param: Any, value: Any) -> None:
    if value and not ctx.resilient_parsing:
        if output.is_verbose():
            raise typer.BadParameter("--quiet and --verbose exclude each other", param_hint="-q/-v")
        output.set_verbosity(output.QUIET)


def _trailing_verbose(ctx: Any, param: Any, value: Any) -> None:
    if value and not ctx.resilient_parsing:
        if output.is_quiet():
            raise typer.BadParameter("--quiet and --verbose exclude each other", param_hint="-q/-v")
        output.set_verbosity(output.verbosity() + int(value))


def _trailing_options() -> dict[str, Any]:
    """Fresh click options -q/--quiet and -v/--verbose (hidden), built by typer."""
    def proto(
        quiet: Annotated[bool, typer.Option("-q", "--quiet", hidden=True, callback=_trailing_quiet,
                                            help="As dcptool -q.")] = False,
        verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, hidden=True,
                                             callback=_trailing_verbose,
                                             help="As dcptool -v.")] = 0,
    ) -> None:  # pragma: no cover
        pass

    t = typer.Typer(add_completion=False)
    t.command()(proto)
    out = {}
    for p in typer.main.get_command(t).params:
        p.expose_value = False  # the command's own function never sees them
        out[p.name] = p
    return out


def add_trailing_verbosity(cmd: Any) -> None:
    """Let a command take the root's -q/--quiet and -v/--verbose after its name too
    (`dcptool backup ARCHIVE -q`), as hidden options, where it has no such option itself
    (tail's -v is its own)."""
    if getattr(cmd, "commands", None) is not None or getattr(cmd, "callback", None) is None:
        return
    taken = {o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
    opts = _trailing_options()
    if not {"-q", "--quiet"} & taken:
        cmd.params.append(opts["quiet"])
    if not {"-v", "--verbose"} & taken:
        cmd.params.append(opts["verbose"])


def suggest(name: str, choices: list[str]) -> list[str]:
    """Commands a mistyped `name` probably meant: prefix matches, then close matches."""
    out = [c for c in choices if c.startswith(name)] if len(name) >= 2 else []
    for c in difflib.get_close_matches(name, choices, n=3, cutoff=0.6):
        if c not in out:
            out.append(c)
    return out[:3]


def _help_option_without_type(self: Any, ctx: Any):
    opt = type(self).get_help_option(self, ctx)
    if opt is not None:
        opt.metavar = ""
    return opt


class _HelpOption:
    __slots__ = ()

    def get_help_option(self, ctx: Any):
        opt = super().get_help_option(ctx)  # type: ignore[misc]
        if opt is not None:
            opt.metavar = ""
        return opt


class DcptoolGroup(_HelpOption, TyperGroup):
    """The root group: reflowed help for the whole tree, suggestions for mistyped commands."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        polish(self)

    def resolve_command(self, ctx: Any, args: list[str]):
        if args and not ctx.resilient_parsing:
            name = args[0]
            if not name.startswith("-") and self.get_command(ctx, name) is None:
                norm = ctx.token_normalize_func(name) if ctx.token_normalize_func else name
                if self.get_command(ctx, norm) is None:
                    matches = suggest(name, [c for c in self.list_commands(ctx)
                                             if not getattr(self.get_command(ctx, c), "hidden", False)])
                    err = _impl.exceptions.UsageError(f"no such command '{name}'", ctx)
                    if matches:
                        err.dcptool_hint = "did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"
                    else:
                        err.dcptool_hint = f"see '{ctx.command_path} --help' for the commands"
                    raise err
        return TyperGroup.resolve_command(self, ctx, args)


app = typer.Typer(
    name="dcptool",
    cls=DcptoolGroup,
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
    version: Annotated[bool, typer.Option(
        "--version", callback=_version_callback, is_eager=True,
        help="Print the version and exit.")] = False,
    quiet: Annotated[bool, typer.Option(
        "-q", "--quiet", help="Print results and errors only: no progress bars, notes "
                              "or summaries on stderr.")] = False,
    verbose: Annotated[int, typer.Option(
        "-v", "--verbose", count=True, show_default=False,
        help="Say more on stderr (what runs, per-vbucket progress of backup, restore and "
             "merge); twice for debug detail and tracebacks.")] = 0,
) -> None:
    """Back up, restore and inspect Couchbase-style data nodes through DCP.

    Results go to stdout (add --json to any command that prints results for a stable,
    documented format; errors are then JSON too); notes and progress go to stderr; -q and
    -v may also follow the command name. Colour is used only on a
    terminal and never when NO_COLOR is set. Each command has a man page, dcptool-COMMAND(1).

    Example: dcptool backup -c couchbase://127.0.0.1 /backups/default
    """
    if quiet and verbose:
        raise typer.BadParameter("--quiet and --verbose exclude each other", param_hint="-q/-v")
    output.set_verbosity(output.QUIET if quiet else verbose)


#: the module (dcptool.cli.NAME) that registers each command, in the order the help lists
#: them: a command line imports only its command's module; help, completion and a name
#: that is no command import them all
COMMAND_MODULES: dict[str, str] = {
    "decode": "decode",
    "node": "node",
    "doc": "doc",
    "collection": "collection",
    "bucket": "bucket",
    "failover-log": "failover_log",
    "tail": "tail",
    "remove": "prune",
    "prune": "prune",
    "info": "info",
    "verify": "verify",
    "backup": "backup",
    "restore": "backup",
    "quickstart": "quickstart",
    "merge": "merge",
    "export": "export",
    "examine": "examine",
    "cluster": "cluster",
    "watermark": "watermark",
    "engine": "engine",
    "key": "key",
}
_ORDER = {m: i for i, m in enumerate(dict.fromkeys(COMMAND_MODULES.values()))}


def _module_of(info: Any) -> str:
    """The command module (a COMMAND_MODULES value) that registered a command or a group (a
    group: by its first command)."""
    group = getattr(info, "typer_instance", None)
    fn = group.registered_commands[0].callback if group is not None else info.callback
    return fn.__module__.rsplit(".", 1)[-1]


def register(names: list[str] | None = None) -> None:
    """Import the modules that register the commands `names` (every command when None) on
    `app`, keeping the help's order whatever was imported first."""
    import importlib

    modules = (list(_ORDER) if names is None
               else list(dict.fromkeys(COMMAND_MODULES[n] for n in names)))
    for m in modules:
        importlib.import_module(f"dcptool.cli.{m}")

    def rank(info: Any) -> int:  # a group ranks by the module of its first command
        return _ORDER.get(_module_of(info), len(_ORDER))

    app.registered_commands.sort(key=rank)
    app.registered_groups.sort(key=rank)


#: root options (none takes a value): what may come before the command's name
_ROOT_FLAGS = re.compile(r"^-(q|v+|h|-quiet|-verbose|-version|-help)$")


def command_named(argv: list[str]) -> str | None:
    """The command a command line runs (its first word after the root options), when it is
    one of dcptool's; None for help, completion or a name that is no command."""
    for word in argv:
        if _ROOT_FLAGS.match(word):
            continue
        return word if word in COMMAND_MODULES else None
    return None


def build_command(only: str | None = None):
    """The click command tree of the app, polished (what `main` runs and the docs describe);
    with `only`, a tree of the commands of that command's module alone, whatever other
    modules were imported before: typer builds every command it is given (some 160 of
    them, 0.2 s of CPU), and a process that runs `main` more than once (a test run, a
    program that embeds dcptool) would pay that for each command line."""
    register(None if only is None else [only])
    if only is None:
        cmd = typer.main.get_command(app)
    else:
        keep = COMMAND_MODULES[only]
        everything = list(app.registered_commands), list(app.registered_groups)
        app.registered_commands[:] = [i for i in everything[0] if _module_of(i) == keep]
        app.registered_groups[:] = [i for i in everything[1] if _module_of(i) == keep]
        try:
            cmd = typer.main.get_command(app)
        finally:
            app.registered_commands[:], app.registered_groups[:] = everything
    polish(cmd)
    return cmd


# -- errors ----------------------------------------------------------------------------------


def error_line(message: str, hint: str | None = None, exit_code: int = EXIT_FAILURE) -> None:
    """The one line of an error on stderr; with --json, one JSON object
    {"error": ..., "hint": ... or null, "exit_code": N} (see docs/json-output.md)."""
    message = " ".join(str(message).split())
    hint = " ".join(str(hint).split()) if hint else None
    if output.json_errors():
        import json

        line = json.dumps({"error": message, "hint": hint, "exit_code": exit_code})
    else:
        line = f"dcptool: error: {message}"
        if hint:
            line += f" (hint: {hint})"
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _fail(message: str, hint: str | None, code: int) -> None:
    error_line(message, hint, code)
    sys.exit(code)


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for --json (before a `--`)."""
    for a in args:
        if a == "--":
            return False
        if a == "--json":
            return True
    return False


def exit_code_of(exc: DcptoolError) -> int:
    """The exit status for an error: its own, or the distinct codes scripts rely on."""
    code = exc.exit_code
    if code == EXIT_FAILURE:
        from dcptool.archive.errors import ArchiveLockedError
        from dcptool.client.errors import RollbackError

        if isinstance(exc, ArchiveLockedError):
            return EXIT_LOCKED
        if isinstance(exc, RollbackError):
            return EXIT_ROLLBACK
    return code


def _sentence(text: str) -> str:
    """Click's 'Invalid value for ...: x.' as 'invalid value for ...: x' (our one-line style)."""
    text = " ".join(text.split()).rstrip(".")
    if len(text) > 1 and text[0].isupper() and not text[1].isupper():
        text = text[0].lower() + text[1:]
    return text


def usage_message(exc: Any) -> tuple[str, str | None]:
    """(message, hint) for a click usage error."""
    ctx = getattr(exc, "ctx", None)
    default_hint = f"see '{ctx.command_path} --help'" if ctx is not None else None
    hint = getattr(exc, "dcptool_hint", None)
    if hint:
        return _sentence(exc.message), hint
    if type(exc).__name__ == "NoSuchOption":
        poss = sorted(getattr(exc, "possibilities", None) or [])
        msg = f"no such option: {exc.option_name}"
        if poss:
            return msg, "did you mean " + " or ".join(poss) + "?"
        return msg, default_hint
    return _sentence(exc.format_message()), default_hint


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _run(command: Any, argv: list[str] | None) -> Any:
    """Run the command; an error that follows Ctrl-C during a Spark job (py4j may replace
    the KeyboardInterrupt with the lost connection's error) is the interruption."""
    from dcptool.pipeline import runtime

    try:
        return command.main(args=argv, prog_name="dcptool", standalone_mode=False)
    except Interrupted:
        raise  # says what the interruption left
    except Exception:
        if runtime.interrupted():
            if output.verbosity() >= output.DEBUG:
                traceback.print_exc()
            return EXIT_INTERRUPTED
        raise


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every user error ends as one line on stderr and a meaningful exit code."""
    output.set_verbosity(output.NORMAL)
    args = list(sys.argv[1:] if argv is None else argv)
    output.set_json_errors(_wants_json(args))
    command = build_command(command_named(args))
    try:
        rc = _run(command, argv)
    except SystemExit:
        # typer ends a run whose stdout was closed (`dcptool ... | head`) with exit(1), after
        # wrapping stdout so later flushes stay quiet; scripts see the usual 141 instead
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":
            _silence_stdout()
            sys.exit(EXIT_BROKEN_PIPE)
        raise
    except DcptoolError as exc:
        if output.verbosity() >= output.DEBUG:
            traceback.print_exc()
        _fail(exc.message, exc.hint, exit_code_of(exc))
    except _NO_ARGS_IS_HELP as exc:
        # click puts the help text in the message; typer's rich help printed it already
        text = getattr(exc, "message", "") or ""
        if text.strip():
            typer.echo(text)
        sys.exit(EXIT_USAGE)
    except _USAGE_ERRORS as exc:
        message, hint = usage_message(exc)
        _fail(message, hint, EXIT_USAGE)
    except _EXITS as exc:
        sys.exit(exc.exit_code)
    except _ABORTS:
        _fail("aborted", None, EXIT_INTERRUPTED)
    except _CLICK_EXCEPTIONS as exc:
        _fail(_sentence(exc.format_message()), None, getattr(exc, "exit_code", EXIT_FAILURE))
    except KeyboardInterrupt:
        _fail("interrupted", None, EXIT_INTERRUPTED)
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
    except OSError as exc:  # the machine's side: a full disk, a permission, a vanished file
        if output.verbosity() >= output.DEBUG:
            traceback.print_exc()
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc}",
              "free some space and run it again" if exc.errno == errno.ENOSPC else None,
              EXIT_FAILURE)
    if rc == EXIT_INTERRUPTED:  # typer turns Ctrl-C into exit status 130 without a word
        error_line("interrupted", None, EXIT_INTERRUPTED)
    sys.exit(rc if isinstance(rc, int) else EXIT_OK)
