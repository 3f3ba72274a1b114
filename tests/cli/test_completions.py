"""completions/: bash, zsh and fish scripts load in their real shells and complete every
subcommand and option of the command tree (so a command or option missing from a script,
because the generator was not re-run, fails here).

bash: the script is sourced and its completion function called with COMP_WORDS/COMP_CWORD.
zsh: `zsh -f` loads it with compinit in a pseudo terminal (zsh/zpty); a completion is
triggered with a real TAB and compadd reports the candidates.
fish: `complete -C "dcptool ..."` after sourcing the script.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import docgen

REPO = Path(__file__).resolve().parents[2]
COMP = REPO / "completions"


@pytest.fixture(scope="module")
def tree():
    return docgen.load_tree()


def cases(tree) -> list[tuple[list[str], set[str]]]:
    """(words typed, the last being completed; what must be offered)."""
    out: list[tuple[list[str], set[str]]] = []
    for c in tree.walk():
        if c.subcommands:
            out.append((["dcptool", *c.path, ""], {s.path[-1] for s in c.subcommands}))
        longs = {o for p in c.options for o in p.all_opts if o.startswith("--")}
        out.append((["dcptool", *c.path, "--"], longs))
    out += [
        (["dcptool", "ba"], {"backup"}),
        (["dcptool", "-v", "--quiet", "ba"], {"backup"}),          # global flags skipped
        (["dcptool", "node", "st"], {"start", "status"}),
        (["dcptool", "backup", "-c", "node", "--ma"], {"--master"}),  # an option's value skipped
        (["dcptool", "export", "--format", ""], {"parquet", "jsonl"}),
        (["dcptool", "node", "start", "--log-level", ""], {"debug", "info", "warning", "error"}),
        (["dcptool", "tail", "--from", "be"], {"beginning"}),
    ]
    return out


def _check(results: dict[str, set[str]], want_cases, exact_options: bool) -> None:
    problems = []
    for words, want in want_cases:
        key = " ".join(words)
        got = results.get(key)
        if got is None:
            problems.append(f"{key!r}: no result")
            continue
        if not want <= got:
            problems.append(f"{key!r}: missing {sorted(want - got)}")
        elif exact_options and words[-1] == "--" and got != want:
            problems.append(f"{key!r}: unexpected {sorted(got - want)}")
    assert not problems, "\n".join(problems)


# -- bash --------------------------------------------------------------------------------------

BASH_HARNESS = r"""
source "$1" || exit 3
while IFS= read -r line; do
    IFS=$'\x1f' read -r -a COMP_WORDS <<< "$line"
    [[ $line == *$'\x1f' ]] && COMP_WORDS+=("")
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    COMPREPLY=()
    _dcptool
    printf '%s\x1e' "${COMP_WORDS[*]}"
    printf '%s\x1f' "${COMPREPLY[@]}"
    printf '\n'
done < "$2"
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_every_command_and_option(tree, tmp_path):
    cs = cases(tree)
    (tmp_path / "cases").write_text("".join("\x1f".join(w) + "\n" for w, _ in cs))
    (tmp_path / "h.bash").write_text(BASH_HARNESS)
    res = subprocess.run(["bash", "--norc", "--noprofile", str(tmp_path / "h.bash"),
                          str(COMP / "dcptool.bash"), str(tmp_path / "cases")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    results = {}
    for line in res.stdout.split("\n"):  # not splitlines(): it splits at \x1e too
        if not line:
            continue
        key, _, rest = line.partition("\x1e")
        results[key] = {x for x in rest.split("\x1f") if x}
    _check(results, cs, exact_options=True)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_file_arguments(tmp_path):
    (tmp_path / "archive-one").mkdir()
    script = (f'source {COMP / "dcptool.bash"}; COMP_WORDS=(dcptool info arch); COMP_CWORD=2; '
              '_dcptool; echo "${COMPREPLY[*]}"')
    res = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert res.stdout.split() == ["archive-one"], res.stdout + res.stderr


# -- zsh ---------------------------------------------------------------------------------------

ZSH_HARNESS = r"""
zmodload zsh/zpty || exit 3
compdir=$1; shift
ready() {  # read until the line editor shows its prompt again (after the marker $1)
  REPLY=""
  zpty -r z REPLY "*$1*RDY> *"
}
sync() {  # run a command and wait until the prompt is back: nothing typed ahead gets lost
  # (the marker is computed, so the echo of the typed line does not match it)
  zpty -w z "$1; print -- __SYNC__\$((1000+$2))"
  ready __SYNC__$((1000+$2))
}
start() {  # a fresh shell
  zpty -d z 2>/dev/null
  zpty z "env PS1='RDY> ' zsh -f -i"  # one string: zpty evaluates it as a command line
  ready ''
  sync "unsetopt autolist automenu listbeep; fpath=($compdir \$fpath); autoload -Uz compinit; compinit -u -D" 1
  sync 'compadd() { if [[ " $* " == *" -"[OAD]" "* ]]; then builtin compadd "$@"; return; fi; local -a __h; builtin compadd -O __h "$@"; (( $#__h )) && print -r -- "<hit>${(j:<hit>:)__h}"; builtin compadd "$@"; }' 2
}
n=10
start
for line in "$@"; do
  n=$((n+1))
  zpty -w -n z "$line"$'\t'
  zpty -w -n z $'\C-u'
  zpty -w z "print -- __END__\$((1000+$n))"
  ready __END__$((1000+n))
  print -r -- "==CASE== $line"
  print -r -- "$REPLY"
  if [[ $REPLY == *"command not found"* || $REPLY == *"(eval)"* ]]; then
    print -r -- "==ERROR== $line"
    start  # a failed completion can leave the line editor in a state the next case trips on
  fi
done
zpty -d z
"""


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_parses_and_defines_the_function(tmp_path):
    res = subprocess.run(["zsh", "-f", "-n", str(COMP / "_dcptool")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    script = (f"fpath=({COMP} $fpath); autoload -Uz compinit; compinit -u -D; "
              "autoload -Uz _dcptool; print -r -- $_comps[dcptool]")
    res = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True,
                         env={**os.environ, "HOME": str(tmp_path)}, timeout=60)
    assert res.stdout.strip() == "_dcptool", res.stdout + res.stderr


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_every_command_and_option(tree, tmp_path):
    cs = cases(tree)
    (tmp_path / "h.zsh").write_text(ZSH_HARNESS)
    lines = [" ".join(w) for w, _ in cs]
    res = subprocess.run(["zsh", "-f", str(tmp_path / "h.zsh"), str(COMP), *lines],
                         capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "HOME": str(tmp_path), "TERM": "xterm"})
    assert res.returncode == 0, res.stderr
    errors = re.findall(r"==ERROR== (.*)", res.stdout)
    assert not errors, f"the completion function failed for: {errors}"
    results: dict[str, set[str]] = {}
    for chunk in res.stdout.split("==CASE== ")[1:]:
        key, _, body = chunk.partition("\n")
        hits: set[str] = set()
        for m in re.finditer(r"((?:<hit>[^\r\n<]*)+)", body):
            hits.update(h for h in m.group(1).split("<hit>") if h)
        results[key] = hits
    _check(results, cs, exact_options=False)


# -- fish --------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_every_command_and_option(tree, tmp_path):
    cs = cases(tree)
    lines = [f"source {COMP / 'dcptool.fish'}"]
    for words, _ in cs:
        typed = " ".join(words)
        lines.append(f"echo '==CASE== {typed}'")
        lines.append(f"complete -C '{typed}'")
    (tmp_path / "h.fish").write_text("\n".join(lines) + "\n")
    res = subprocess.run(["fish", "--no-config", str(tmp_path / "h.fish")], capture_output=True,
                         text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "error" not in res.stderr.lower(), res.stderr
    results: dict[str, set[str]] = {}
    key = None
    for line in res.stdout.splitlines():
        if line.startswith("==CASE== "):
            key = line[len("==CASE== "):]
            results[key] = set()
        elif key is not None and line:
            results[key].add(line.split("\t", 1)[0])
    _check(results, cs, exact_options=True)


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_describes_subcommands():
    res = subprocess.run(["fish", "--no-config", "-c",
                          f"source {COMP / 'dcptool.fish'}; complete -C 'dcptool ba'"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HOME": "/nonexistent"})
    assert res.stdout.startswith("backup\tBack up every bucket of a cluster"), res.stdout
