"""man/: one page per command, generated from the command tree, rendering without warnings.

The drift checks read the files in man/ (what is committed), not the generator's output, and
compare them with the command tree the CLI runs: a command or option that exists in the
app but not on its page fails here until `python scripts/gen_cli_docs.py` is run.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import docgen

REPO = Path(__file__).resolve().parents[2]
MAN = REPO / "man"
SECTIONS = ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT", "FILES",
            "EXAMPLES", "SEE ALSO")


@pytest.fixture(scope="module")
def tree():
    return docgen.load_tree()


def roff(text: str) -> str:
    return docgen.roff_escape(text)


def sections(page: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    for line in page.splitlines():
        m = re.match(r'^\.SH "?([^"]+)"?$', line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def test_the_generated_files_are_up_to_date():
    """`gen_cli_docs.py --check` passes: what is in man/, completions/ and
    docs/exit-codes.md is what the command tree produces now."""
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_docs.py"), "--check"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, f"{res.stderr}\n(run: python scripts/gen_cli_docs.py)"


def test_check_mode_reports_a_stale_file(tmp_path):
    (tmp_path / "man").mkdir()
    (tmp_path / "man" / "dcptool-gone.1").write_text(".TH X 1\n")
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_docs.py"), "--check",
                          "--repo", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "out of date: man/dcptool-backup.1" in res.stderr
    assert "no longer generated: man/dcptool-gone.1" in res.stderr


def test_a_page_for_every_command(tree):
    want = {"dcptool.1"} | {f"dcptool-{c.path[0]}.1" for c in tree.subcommands}
    have = {p.name for p in MAN.glob("*.1")}
    assert want - have == set(), f"missing pages: {sorted(want - have)}"
    assert have - want == set(), f"pages of commands that are gone: {sorted(have - want)}"
    for name in ("backup", "restore", "tail", "failover-log", "node", "info", "verify",
                 "decode", "quickstart"):
        assert f"dcptool-{name}.1" in have


def test_every_page_has_the_sections(tree):
    for page in MAN.glob("*.1"):
        found = sections(page.read_text())
        missing = [s for s in SECTIONS if s not in found or not found[s].strip()]
        assert not missing, f"{page.name}: missing {missing}"


def test_every_command_and_option_is_on_its_page(tree):
    missing = []
    for top in tree.subcommands:
        page = (MAN / docgen.page_file(top)).read_text()
        found = sections(page)
        for c in top.walk():
            if c is not top and roff(c.name) not in found.get("SYNOPSIS", "") + found.get("COMMANDS", ""):
                missing.append(f"{top.path[0]}: command {c.name}")
            for p in c.options:
                for o in p.all_opts:
                    if f"\\fB{roff(o)}\\fR" not in found["OPTIONS"]:
                        missing.append(f"{c.name}: option {o}")
            for a in c.arguments:
                if f"\\fI{roff(a.metavar)}\\fR" not in found["OPTIONS"]:
                    missing.append(f"{c.name}: argument {a.metavar}")
            for ex in docgen.examples_of(c.help):
                if roff(ex) not in found["EXAMPLES"]:
                    missing.append(f"{c.name}: example {ex}")
            for p in c.options:
                for e in p.envvars:
                    if roff(e) not in found["ENVIRONMENT"]:
                        missing.append(f"{c.name}: environment variable {e}")
    root = sections((MAN / "dcptool.1").read_text())
    for c in tree.subcommands:
        if roff(f"dcptool-{c.path[0]}") not in root["COMMANDS"]:
            missing.append(f"dcptool.1: command {c.path[0]}")
    for p in tree.options:
        for o in p.all_opts:
            if f"\\fB{roff(o)}\\fR" not in root["OPTIONS"]:
                missing.append(f"dcptool.1: option {o}")
    assert not missing, "not on their man pages:\n" + "\n".join(missing)


def test_exit_statuses_are_documented(tree):
    from dcptool.cli.app import EXIT_STATUS

    root = sections((MAN / "dcptool.1").read_text())["EXIT STATUS"]
    codes_md = (REPO / "docs" / "exit-codes.md").read_text()
    for code, _ in EXIT_STATUS:
        assert f".B {code}\n" in root
        assert f"| {code} |" in codes_md
    verify = sections((MAN / "dcptool-verify.1").read_text())["EXIT STATUS"]
    assert "problem" in verify
    tail = sections((MAN / "dcptool-tail.1").read_text())["EXIT STATUS"]
    assert ".B 4\n" in tail


def _man_available() -> bool:
    return shutil.which("man") is not None and shutil.which("groff") is not None


@pytest.mark.skipif(not _man_available(), reason="man and groff are not installed")
def test_pages_render_without_warnings():
    env = {**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat", "LANG": "C.UTF-8"}
    for page in sorted(MAN.glob("*.1")):
        res = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True,
                             text=True, env=env, timeout=60)
        assert res.returncode == 0, (page.name, res.stderr)
        assert res.stderr.strip() == "", f"{page.name}: {res.stderr}"
        assert "NAME" in res.stdout and "EXIT STATUS" in res.stdout
        res = subprocess.run(["groff", "-ww", "-man", "-z", str(page)], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0 and res.stderr.strip() == "", f"{page.name}: {res.stderr}"


@pytest.mark.skipif(not _man_available(), reason="man and groff are not installed")
def test_backup_page_reads_as_expected():
    env = {**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat", "LANG": "C.UTF-8"}
    text = subprocess.run(["man", "-l", str(MAN / "dcptool-backup.1")], capture_output=True,
                          text=True, env=env, timeout=60).stdout
    # options keep ASCII hyphens (copy-paste works) and are not hyphenated across lines
    assert "--purge-partial" in text and "DCPTOOL_PASSWORD" in text
    assert "dcptool backup -c couchbase://127.0.0.1 /backups/cluster" in text
    assert "ARCHIVE/logs/backup-TIME.log" in text


def test_roff_escaping():
    assert docgen.roff_escape("a-b \\n") == "a\\-b \\en"
    assert docgen.roff_escape(".starts with a dot\n'quote") == "\\&.starts with a dot\n\\&'quote"
