"""Help texts, one-line errors with hints, exit statuses, --version, verbosity, colour, packaging.

Most checks walk the command tree (`docgen.load_tree`, scripts/docgen.py), so a command added
later is held to the same rules without touching this file.
"""
from __future__ import annotations

import json
import os
import pty
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import docgen
import pytest
from termutil import drain_pty

from dcptool.cli import app as cli_app
from dcptool.cli import output

REPO = Path(__file__).resolve().parents[2]


def run(*args, env_extra=None, stdin_text=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DCPTOOL_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "dcptool", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=timeout,
                          input=stdin_text, stdin=None if stdin_text is not None else subprocess.DEVNULL)


def error_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("dcptool: error: "), lines[0]
    return lines[0]


def in_process(argv, capsys, monkeypatch, columns=400):
    """Run main() here (fast): (exit status, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("NO_COLOR", "1")
    try:
        cli_app.main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def tree():
    return docgen.load_tree()


# -- help texts --------------------------------------------------------------------------------


def test_every_command_has_help_and_an_example(tree):
    missing = []
    for c in tree.walk():
        if not docgen.prose_of(c.help):
            missing.append(f"{c.name}: no help text")
        if not docgen.examples_of(c.help):
            missing.append(f"{c.name}: no 'Example:' line in its help")
    assert not missing, "\n".join(missing)


def test_every_option_and_argument_has_help(tree):
    missing = [f"{c.name} {p.opts[0] if p.opts else p.metavar}"
               for c in tree.walk() for p in c.params if not p.help.strip()]
    assert not missing, f"without help text: {missing}"


def test_every_example_is_a_command_line_the_cli_accepts(tree):
    assert docgen.example_problems(tree) == []


def test_a_wrong_example_is_reported():
    class Fake:
        help = "Does things.\n\nExample: dcptool backup /b --no-such-option"

    cmd = docgen.Cmd(("backup",), Fake(), [])
    tree = docgen.Cmd((), Fake(), [], [cmd])
    tree.command.help = "Root.\n\nExample: dcptool info /b"
    problems = docgen.example_problems(tree)
    assert len(problems) == 1 and "--no-such-option" in problems[0]


def test_docstring_paragraphs_render_as_flowing_text(tree, capsys, monkeypatch):
    """Single line breaks of a docstring do not show up in --help (they used to:
    'time,' / 'vbuckets' on two lines of the command list)."""
    code, out, _ = in_process(["--help"], capsys, monkeypatch)
    assert code == 0
    assert "complete or partial, time, vbuckets, counts" in out
    for c in tree.walk():
        if not c.path:
            continue
        code, out, _ = in_process([*c.path, "--help"], capsys, monkeypatch)
        assert code == 0, c.name
        flat = " ".join(out.split())
        for para in docgen.prose_of(c.help):
            assert " ".join(para.split()) in flat, f"{c.name}: paragraph broken up: {para[:60]}"
        for ex in docgen.examples_of(c.help):
            assert ex in out, f"{c.name}: example not on a line of its own"


def test_reflow_joins_lines_but_keeps_examples_and_paragraphs():
    text = """First line
    continues here.

    Second paragraph
    goes on.

    Example: dcptool a
    Example: dcptool b
    """
    assert cli_app.reflow(text) == ("First line continues here.\n\nSecond paragraph goes on."
                                    "\n\nExample: dcptool a\nExample: dcptool b")


def test_usage_lines_show_plain_placeholders(capsys, monkeypatch):
    code, out, _ = in_process(["info", "--help"], capsys, monkeypatch)
    assert "Usage: dcptool info [OPTIONS] ARCHIVE" in out
    code, out, _ = in_process(["decode", "--help"], capsys, monkeypatch)
    assert "Usage: dcptool decode [OPTIONS] [SOURCE]" in out
    assert "<bool>" not in out


# -- errors and exit statuses ------------------------------------------------------------------


@pytest.mark.parametrize("argv,line", [
    (["bakup"], "dcptool: error: no such command 'bakup' (hint: did you mean 'backup'?)"),
    (["node", "strt"], "dcptool: error: no such command 'strt' (hint: did you mean 'start' or "
                       "'status'?)"),
    (["zzzz"], "dcptool: error: no such command 'zzzz' (hint: see 'dcptool --help' for the "
               "commands)"),
    (["info", "--jsn", "x"], "dcptool: error: no such option: --jsn (hint: did you mean --json?)"),
    (["info"], "dcptool: error: missing argument 'ARCHIVE' (hint: see 'dcptool info --help')"),
    (["-q", "-v", "info", "x"], "dcptool: error: invalid value for -q/-v: --quiet and --verbose "
                                "exclude each other (hint: see 'dcptool --help')"),
])
def test_usage_errors_are_one_line_with_a_hint_and_status_2(argv, line, capsys, monkeypatch):
    code, out, err = in_process(argv, capsys, monkeypatch)
    assert code == 2
    assert err.strip() == line
    assert "Traceback" not in err


def test_usage_error_in_a_real_process():
    res = run("bakup")
    assert res.returncode == 2
    assert error_line(res) == "dcptool: error: no such command 'bakup' (hint: did you mean 'backup'?)"


def test_bad_option_value_is_a_usage_error(capsys, monkeypatch):
    code, _, err = in_process(["backup", "/tmp/x", "--level", "99"], capsys, monkeypatch)
    assert code == 2
    assert err.startswith("dcptool: error: invalid value for '--level'")
    assert len(err.strip().splitlines()) == 1


def test_failure_is_status_1_and_one_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.hex"
    bad.write_text("80 00 zz\n")
    code, out, err = in_process(["decode", str(bad), "--json"], capsys, monkeypatch)
    assert code == 1
    assert json.loads(out)["error"]


def test_a_closed_pipe_is_status_141_without_noise(tmp_path):
    capture = tmp_path / "many.hex"
    capture.write_text("8000000a000000000000000a0000000000000000000000006169726c696e655f3130\n" * 20000)
    script = (f"{shlex.quote(sys.executable)} -m dcptool decode {shlex.quote(str(capture))} --json"
              " | head -1; echo \"status=${PIPESTATUS[0]}\"")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert res.stdout.splitlines()[-1] == "status=141", res.stdout[-300:]
    assert res.stderr == ""


def test_ctrl_c_is_status_130_and_one_line():
    for wait in (1.5, 4, 10):  # a SIGINT before Python is up kills it outright: wait longer
        proc = subprocess.Popen([sys.executable, "-m", "dcptool", "decode", "--raw"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(wait)  # started and blocked reading stdin
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        if proc.returncode != -signal.SIGINT:
            break
    assert proc.returncode == 130
    assert err.strip() == "dcptool: error: interrupted"


def test_no_arguments_prints_help_and_status_2():
    res = run()
    assert res.returncode == 2
    assert "Usage: dcptool" in res.stdout + res.stderr


def test_exit_codes_of_dcptool_errors():
    from dcptool.archive.errors import ArchiveLockedError
    from dcptool.client.errors import RollbackError
    from dcptool.errors import DcptoolError, UsageError

    assert cli_app.exit_code_of(DcptoolError("x")) == 1
    assert cli_app.exit_code_of(UsageError("x")) == 2
    assert cli_app.exit_code_of(ArchiveLockedError("x")) == 3
    assert cli_app.exit_code_of(RollbackError("x")) == 4


def test_a_locked_archive_is_status_3(shared_node, tmp_path):
    """A second writer of an archive gets status 3, so a cron job can tell 'busy' from 'broken'."""
    from dcptool.archive import Archive

    path = tmp_path / "arch"
    Archive.create(path, bucket="default", vbuckets=shared_node.vbuckets)
    archive = Archive.open(path)
    with archive.lock("a test holding the lock"):
        res = run("backup", "-c", f"{shared_node.host}:{shared_node.port}", str(path),
                  env_extra={"DCPTOOL_PASSWORD": shared_node.password})
    assert res.returncode == 3, res.stderr
    assert "lock" in error_line(res)


def test_rollback_refused_by_tail_is_status_4(shared_node, tmp_path):
    """tail --fail-on-rollback exits 4 when the node asks for a rollback (here: a state file
    whose vbucket uuid is not in the node's history)."""
    env = {"DCPTOOL_PASSWORD": shared_node.password,
           "DCPTOOL_CLUSTER": f"{shared_node.host}:{shared_node.port}"}
    assert run("doc", "load", "--count", "50", "--prefix", "rb::", env_extra=env).returncode == 0
    state = tmp_path / "tail.state"
    res = run("tail", "--from", "beginning", "--vbuckets", "0", "--state", str(state),
              "--until-idle", "0.5", "--keys-only", env_extra=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(state.read_text())
    text = json.dumps(doc)
    # every uuid the node gave: replace with one it never had
    uuids = {str(e["uuid"]) for p in _positions(doc) for e in [p] if "uuid" in p}
    assert uuids
    for u in uuids:
        text = text.replace(u, "12345")
    state.write_text(text)
    res = run("tail", "--from", str(state), "--vbuckets", "0", "--until-idle", "1",
              "--fail-on-rollback", env_extra=env)
    assert res.returncode == 4, (res.returncode, res.stderr)
    assert "roll back" in error_line(res)


def _positions(doc):
    out = []
    if isinstance(doc, dict):
        if "uuid" in doc and "seqno" in doc:
            out.append(doc)
        for v in doc.values():
            out += _positions(v)
    elif isinstance(doc, list):
        for v in doc:
            out += _positions(v)
    return out


# -- version, python -m, packaging -------------------------------------------------------------


def test_version_and_python_dash_m():
    res = run("--version")
    assert res.returncode == 0
    assert res.stdout.strip() == f"dcptool {version('dcptool')}"
    exe = shutil.which("dcptool")
    if exe:
        res2 = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        assert res2.stdout == res.stdout


def _build_requirements_met() -> bool:
    """This environment holds what pyproject.toml's [build-system] requires."""
    import tomllib
    from importlib.metadata import PackageNotFoundError

    from packaging.requirements import Requirement

    for text in tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]:
        req = Requirement(text)
        try:
            if not req.specifier.contains(version(req.name), prereleases=True):
                return False
        except PackageNotFoundError:
            return False
    return True


def test_pip_install_from_a_clean_checkout_works_offline(tmp_path):
    """Copy the checkout's files (tracked and new, nothing ignored) and install them with the
    package index switched off: `pip install .` needs nothing but the build requirements.
    Those come from this environment when it has them (`pip install -e '.[test]'` puts
    them there), else they are fetched once beforehand. The new environment sees this one's
    packages whatever made it (venv or not), but not its PYTHONPATH. The installed copy has
    the `dcptool` script, works with `python -m dcptool`, and puts the man pages and
    completions under share/."""
    import site
    import sysconfig

    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL",
                        "PIP_FIND_LINKS")}
    env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)  # nor this machine's pip.conf
    if _build_requirements_met():
        how = ["--no-build-isolation"]
    else:
        cache = tmp_path / "cache"
        dl = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(cache),
                             "setuptools>=68", "wheel"], capture_output=True, text=True,
                            timeout=300)
        assert dl.returncode == 0, f"cannot fetch the build requirements: {dl.stderr[-300:]}"
        how = ["--find-links", str(cache)]
        env["PIP_FIND_LINKS"] = str(cache)
    venv = tmp_path / "venv"
    # no pip of its own (ensurepip costs seconds): this environment's pip installs into it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120, env=env)
    py = venv / "bin" / "python"
    # this environment's packages (dcptool's dependencies), listed after the new one's own:
    # only their directories, not their .pth files (no editable dcptool from there)
    here = [p for p in [*site.getsitepackages(), sysconfig.get_path("purelib"),
                        sysconfig.get_path("platlib")] if os.path.isdir(p)]
    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([str(py), "-c", ask], capture_output=True, text=True, check=True,
                             env=env).stdout.strip()
    Path(purelib, "outer.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(here)))
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                          "--no-index", *how, str(src)],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import dcptool; print(dcptool.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=240, env=env)
    assert str(venv) in where.stdout, where.stdout  # the installed copy, not the checkout
    for argv in ([str(venv / "bin" / "dcptool"), "--version"],
                 [str(py), "-m", "dcptool", "--version"]):
        out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=240,
                             env=env)
        assert out.returncode == 0 and out.stdout.startswith("dcptool "), (argv, out.stderr)
    share = venv / "share"
    assert (share / "man" / "man1" / "dcptool-backup.1").is_file()
    assert (share / "bash-completion" / "completions" / "dcptool.bash").is_file()
    assert (share / "zsh" / "site-functions" / "_dcptool").is_file()
    assert (share / "fish" / "vendor_completions.d" / "dcptool.fish").is_file()
    if shutil.which("man"):
        found = subprocess.run(["man", "-w", "dcptool-backup"], capture_output=True, text=True,
                               env={**env, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
                                    "MANPATH": ""}, timeout=240)
        assert str(share / "man") in found.stdout, found.stdout + found.stderr


# -- verbosity, colour, progress -------------------------------------------------------------


def test_quiet_drops_notes_and_verbose_adds_detail(capsys):
    try:
        output.set_verbosity(output.QUIET)
        output.note("a note")
        output.detail("a detail")
        assert capsys.readouterr().err == ""
        output.set_verbosity(output.NORMAL)
        output.note("a note")
        output.detail("a detail")
        assert capsys.readouterr().err == "a note\n"
        output.set_verbosity(output.VERBOSE)
        output.detail("a detail")
        assert capsys.readouterr().err == "a detail\n"
    finally:
        output.set_verbosity(output.NORMAL)


def test_global_options_set_the_verbosity_of_the_run(tmp_path, capsys, monkeypatch):
    from dcptool.archive import Archive

    Archive.create(tmp_path / "a", bucket="default", vbuckets=4)
    try:
        for argv, level in ((["-q"], output.QUIET), ([], output.NORMAL),
                            (["-v"], output.VERBOSE), (["-vv"], output.DEBUG),
                            (["--verbose", "--verbose"], output.DEBUG)):
            code, out, err = in_process([*argv, "info", str(tmp_path / "a")], capsys, monkeypatch)
            assert code == 0 and "no backups yet" in out
            assert output.verbosity() == level, argv
    finally:
        output.set_verbosity(output.NORMAL)


def test_verbose_tail_prints_its_summary(shared_node):
    env = {"DCPTOOL_PASSWORD": shared_node.password,
           "DCPTOOL_CLUSTER": f"{shared_node.host}:{shared_node.port}"}
    plain = run("tail", "--from", "beginning", "--until-idle", "0.3", "--keys-only", env_extra=env)
    loud = run("--verbose", "tail", "--from", "beginning", "--until-idle", "0.3", "--keys-only",
               env_extra=env)
    assert plain.returncode == loud.returncode == 0
    assert "dcptool tail:" not in plain.stderr
    assert "dcptool tail:" in loud.stderr


def test_progress_bars_only_on_a_terminal_and_not_when_quiet(monkeypatch):
    monkeypatch.setattr(output, "stderr_is_terminal", lambda: False)
    assert not output.show_progress()
    monkeypatch.setattr(output, "stderr_is_terminal", lambda: True)
    assert output.show_progress()
    assert not output.show_progress(disabled=True)
    try:
        output.set_verbosity(output.QUIET)
        assert not output.show_progress()
    finally:
        output.set_verbosity(output.NORMAL)


_SGR = re.compile(r"\x1b\[([0-9;]*)m")


def _colour_codes(text: str) -> set[str]:
    """SGR parameters that set a colour (30-38, 40-48, 90-97, 100-107)."""
    out = set()
    for m in _SGR.finditer(text):
        params = [p for p in m.group(1).split(";") if p]
        i = 0
        while i < len(params):
            n = int(params[i])
            if n in (38, 48):
                out.add(";".join(params[i:i + 3]))
                i += 5 if i + 1 < len(params) and params[i + 1] == "2" else 3
                continue
            if 30 <= n <= 37 or 40 <= n <= 47 or 90 <= n <= 97 or 100 <= n <= 107:
                out.add(str(n))
            i += 1
    return out


def _run_in_pty(args, env_extra, cwd) -> str:
    """Run dcptool with stdout and stderr on a pseudo terminal; return what it wrote."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update({"TERM": "xterm-256color", "COLUMNS": "160", **env_extra})
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", *args], stdout=slave, stderr=slave,
                            stdin=subprocess.DEVNULL, env=env, cwd=cwd)
    os.close(slave)
    data = drain_pty(master, proc, time.monotonic() + 60)
    proc.wait(10)
    os.close(master)
    return data.decode("utf-8", "replace")


def test_colour_only_on_a_terminal_and_never_with_no_color(tmp_path):
    capture = tmp_path / "cap.hex"
    capture.write_text("8000000a000000000000000a0000000000000000000000006169726c696e655f3130\n"
                       "80 00 zz\n")  # one good frame, one malformed (shown in red)
    on_tty = _run_in_pty(["decode", str(capture), "--table"], {}, tmp_path)
    assert "GET" in on_tty and _colour_codes(on_tty), repr(on_tty[:300])
    no_color = _run_in_pty(["decode", str(capture), "--table"], {"NO_COLOR": "1"}, tmp_path)
    assert "GET" in no_color and not _colour_codes(no_color), _colour_codes(no_color)
    piped = run("decode", str(capture), "--table")
    assert "GET" in piped.stdout and "\x1b[" not in piped.stdout + piped.stderr


def test_help_has_no_colour_when_piped():
    res = run("backup", "--help")
    assert res.returncode == 0 and "\x1b[" not in res.stdout


# -- --json ------------------------------------------------------------------------------------

#: commands that print no results (they run something), so they have no --json
NO_RESULTS = {("node", "start")}


def test_every_command_that_prints_results_has_json(tree):
    missing = [c.name for c in tree.walk()
               if not c.subcommands and c.path and c.path not in NO_RESULTS
               and not any("--json" in p.all_opts for p in c.options)]
    assert not missing, f"without --json: {missing}"


def test_every_command_is_found_in_the_module_that_registers_it():
    """`COMMAND_MODULES` names, for every command of the whole tree, the module whose import
    registers it: a command line that imports only that module finds its command."""
    cli_app.register()
    found = {}
    for info in cli_app.app.registered_commands:
        found[info.name or info.callback.__name__.replace("_", "-")] = info.callback.__module__
    for info in cli_app.app.registered_groups:
        found[info.name] = info.typer_instance.registered_commands[0].callback.__module__
    assert set(found) == set(cli_app.build_command().commands)
    assert {n: f"dcptool.cli.{m}" for n, m in cli_app.COMMAND_MODULES.items()} == found


def test_a_command_line_imports_its_command_alone():
    """`dcptool backup ...` imports the backup command's module, not every command's (the
    node server, decode, tail, ...): a command pays for its own imports only. Help and a
    name that is no command still see the whole tree."""
    probe = ("import sys\n"
             "from dcptool.cli import app\n"
             "try:\n"
             "    app.main(sys.argv[1:])\n"
             "except SystemExit:\n"
             "    pass\n"
             "import json\n"
             "print(json.dumps([m for m in sys.modules if m.startswith('dcptool.')]),"
             " file=sys.stderr)\n")

    def imported(*argv: str) -> set[str]:
        r = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        return set(json.loads(r.stderr.strip().splitlines()[-1]))

    alone = imported("-q", "backup", "--help")
    assert "dcptool.cli.backup" in alone
    assert not alone & {"dcptool.cli.node", "dcptool.cli.decode", "dcptool.cli.tail",
                        "dcptool.node.server", "dcptool.cli.cluster"}, sorted(alone)
    every = {f"dcptool.cli.{m}" for m in cli_app.COMMAND_MODULES.values()}
    assert every <= imported("--help")
    assert every <= imported("bakup")
