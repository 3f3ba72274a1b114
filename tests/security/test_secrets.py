"""Secrets stay secret: a password given through DCPTOOL_PASSWORD, DCPTOOL_PASSWORD_FILE or
--password-file never shows up in help, any command's output (errors and --json included),
run logs, archive files, the node's log or data files (the users file holds salted SCRAM
credentials only), or a process listing (/proc/PID/cmdline).

The one place the password is stored on purpose: a cluster member's DIR/cluster.json keeps
the credentials replication connects with (`dcptool cluster create` sends them); that file
is mode 0600 and its content is never printed.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import zygote

from dcptool.cli.app import build_command, main
from dcptool.protocol import vbucket_of

REPO = Path(__file__).resolve().parents[2]
PW = "Sekr3t-" + secrets.token_hex(8)
PWB = PW.encode()


@pytest.fixture(scope="module")
def pwfile(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("pw") / "password"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(PW + "\n")
    return p


@pytest.fixture(scope="module")
def pair(tmp_path_factory, pwfile):
    """Two nodes whose admin password came from --password-file (never a command line)."""
    from nodeprocutil import NodeProcess

    base = tmp_path_factory.mktemp("secretnodes")
    nodes = [NodeProcess(base / n, vbuckets=4, password=None,
                         extra_args=("--password-file", str(pwfile))) for n in ("a", "b")]
    try:
        for n in nodes:
            n.start()
            n.password = PW
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in ("DCPTOOL_PASSWORD", "DCPTOOL_PASSWORD_FILE", "DCPTOOL_CLUSTER")}
    full.update(env, NO_COLOR="1", COLUMNS="200")
    return zygote.run(args, env=full, cwd=REPO, timeout=timeout)  # forked from the warm zygote


def addr(n) -> str:
    return f"{n.host}:{n.port}"


def files_holding(root: Path, needle: bytes, skip: set[str] = frozenset()) -> list[str]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in skip and needle in p.read_bytes():
            out.append(str(p.relative_to(root)))
    return out


def _command_paths(cmd, prefix=()):
    yield prefix
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        yield from _command_paths(sub, prefix + (name,))


def test_help_never_shows_the_password_and_offers_password_file(monkeypatch, pwfile):
    monkeypatch.setenv("DCPTOOL_PASSWORD", PW)
    monkeypatch.setenv("DCPTOOL_PASSWORD_FILE", str(pwfile))
    monkeypatch.setenv("COLUMNS", "200")
    tree = build_command()
    with_p = 0
    for path in _command_paths(tree):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err), pytest.raises(SystemExit):
            main([*path, "--help"])
        text = out.getvalue() + err.getvalue()
        assert PW not in text, path
        cmd = tree
        for name in path:
            cmd = cmd.commands[name]
        if any("-p" in getattr(p, "opts", ()) for p in getattr(cmd, "params", ())):
            with_p += 1
            assert "--password-file" in text, path
    assert with_p >= 10  # every client command with -p also offers --password-file


def test_password_file_errors_are_one_line_and_name_only_the_file(pair, tmp_path):
    a = pair[0]
    missing = tmp_path / "nope"
    r = cli("failover-log", "-c", addr(a), "--password-file", str(missing), env={})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert str(missing) in r.stderr and "No such file" in r.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    r = cli("failover-log", "-c", addr(a), env={"DCPTOOL_PASSWORD_FILE": str(empty)})
    assert r.returncode == 2 and "first line is empty" in r.stderr, r.stderr
    r = cli("failover-log", "-c", addr(a), "-p", "x", "--password-file", str(empty), env={})
    assert r.returncode == 2 and "not both" in r.stderr, r.stderr
    # a file whose first line is the password: the rest of the file is ignored
    two = tmp_path / "two"
    two.write_text(PW + "\nnot the password\n")
    r = cli("failover-log", "-c", addr(a), "--password-file", str(two), "--json", env={})
    assert r.returncode == 0, r.stderr
    # --password-file on the command line wins over DCPTOOL_PASSWORD
    r = cli("failover-log", "-c", addr(a), "--password-file", str(two), "--json",
            env={"DCPTOOL_PASSWORD": "wrong"})
    assert r.returncode == 0, r.stderr
    assert PW not in r.stdout + r.stderr


def in_process(args, env: dict[str, str], monkeypatch, capfd) -> subprocess.CompletedProcess:
    """`dcptool ARGS` through main() in this process (Spark jobs reuse the session's Spark)."""
    with monkeypatch.context() as m:
        for k in ("DCPTOOL_PASSWORD", "DCPTOOL_PASSWORD_FILE", "DCPTOOL_CLUSTER"):
            m.delenv(k, raising=False)
        for k, v in env.items():
            m.setenv(k, v)
        m.setenv("NO_COLOR", "1")
        capfd.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


SPARK_COMMANDS = {"backup", "merge", "restore", "export"}


def test_no_output_log_archive_or_data_file_holds_the_password(pair, pwfile, tmp_path, spark,
                                                              monkeypatch, capfd):
    a, b = pair
    by_file = {"DCPTOOL_PASSWORD_FILE": str(pwfile)}
    by_env = {"DCPTOOL_PASSWORD": PW}
    archive = tmp_path / "archive"
    outputs: list[str] = []

    def run(*args, env, ok=True):
        if SPARK_COMMANDS & set(args[:2]):
            r = in_process(args, env, monkeypatch, capfd)
        else:
            r = cli(*args, env=env)
        outputs.append(f"$ {' '.join(args)}\n{r.stdout}\n{r.stderr}")
        if ok:
            assert r.returncode == 0, (args, r.stderr)
        return r

    run("doc", "load", "-c", addr(a), "--count", "200", "--json", env=by_env)
    plan = json.loads(run("cluster", "create", "-c", addr(a), "-c", addr(b), "--replicas", "1",
                          "--json", env=by_file).stdout)
    key = "k1"
    owner = pair[plan["vbmap"][vbucket_of(key.encode(), 4)][0]]  # doc writes go to the active
    run("doc", "set", "-c", addr(owner), key, '{"a": 1}', env=by_file)
    run("doc", "get", "-c", addr(owner), key, "--json", env=by_env)
    run("doc", "delete", "-c", addr(owner), key, env=by_file)
    run("-v", "backup", "-c", addr(a), str(archive), "--json", env=by_env)
    run("doc", "set", "-c", addr(owner), key, '{"a": 2}', env=by_env)
    run("backup", "-c", addr(b), str(archive), "--json", env=by_file)
    run("cluster", "status", "-c", addr(a), "--json", env=by_env)
    run("cluster", "status", "-c", addr(b), env=by_file)
    run("failover-log", "-c", addr(a), "--json", env=by_file)
    run("tail", "-c", addr(a), "--from", "beginning", "--until-idle", "1", "--json",
        "--state", str(tmp_path / "tail.state"), env=by_env)
    run("watermark", "list", "-c", addr(a), "--json", env=by_file)
    run("info", str(archive), "--json", env=by_env)
    run("verify", str(archive), env=by_env)
    run("merge", str(archive), "--json", env=by_env)
    run("restore", str(archive), "-c", addr(a), "--dry-run", "--json", env=by_file)
    run("node", "status", "--data", str(a.data_dir), "--json", "--password-file", str(pwfile),
        env={})
    run("node", "status", "--data", str(b.data_dir), env=by_env)
    # errors: a wrong password (by file and env), verbose, and an unreachable node
    wrong = tmp_path / "wrong"
    wrong.write_text(PW + "-wrong\n")
    for env in ({"DCPTOOL_PASSWORD_FILE": str(wrong)}, {"DCPTOOL_PASSWORD": PW + "-wrong"}):
        r = run("-v", "failover-log", "-c", addr(a), "--json", env=env, ok=False)
        assert r.returncode != 0 and "auth" in r.stderr.lower(), r.stderr
        r = run("backup", "-c", addr(a), str(tmp_path / "other"), "--json", env=env, ok=False)
        assert r.returncode != 0
    r = run("-v", "backup", "-c", "127.0.0.1:1", str(tmp_path / "other2"), env=by_env, ok=False)
    assert r.returncode != 0

    text = "\n".join(outputs)
    assert PW not in text  # nor the wrong one, which is the right one with a suffix
    assert json.loads(cli("cluster", "status", "-c", addr(a), "--json", env=by_env).stdout)

    # the archive: data, manifests, run logs (backup, merge, restore)
    logs = list((archive / "logs").glob("*.log"))
    assert {p.name.split("-")[0] for p in logs} >= {"backup", "merge", "restore"}, logs
    assert files_holding(archive, PWB) == []
    assert files_holding(tmp_path, PWB, skip={"wrong"}) == []  # state files, other archives

    # the nodes: logs and data files; the users file holds SCRAM credentials only
    for n in (a, b):
        assert (n.data_dir / "logs" / "node.log").stat().st_size > 0
        assert files_holding(n.data_dir, PWB, skip={"cluster.json"}) == [], n.data_dir
        users = [p for p in n.data_dir.iterdir() if p.is_file() and "user" in p.name]
        assert users, sorted(p.name for p in n.data_dir.iterdir())
        for u in users:
            assert PWB not in u.read_bytes()
            assert u.stat().st_mode & 0o777 == 0o600, u
        # the cluster map keeps the replication credentials: owner-only
        cmap = n.data_dir / "cluster.json"
        assert cmap.stat().st_mode & 0o777 == 0o600
        assert json.loads(cmap.read_text())["auth"]["password"] == PW


def _descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo.extend(kids.get(p, ()))
    return out


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_process_listings_never_show_the_password(pair, tmp_path):
    a = pair[0]
    for n in pair:
        assert PWB not in Path(f"/proc/{n.pid}/cmdline").read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "DCPTOOL_PASSWORD_FILE"}
    env.update(DCPTOOL_PASSWORD=PW, NO_COLOR="1")
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", "backup", "-c", addr(a),
                             str(tmp_path / "archive")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=REPO)
    samples = 0
    seen_pids: set[int] = set()
    try:
        while proc.poll() is None:
            for pid in _descendants(proc.pid):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                seen_pids.add(pid)
                assert PWB not in cmdline, cmdline.replace(b"\0", b" ")[:300]
            samples += 1
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert samples >= 3 and len(seen_pids) >= 2, (samples, seen_pids)  # dcptool and its JVM
    assert PWB not in out + err


def test_conn_options_read_the_password_file_variable(monkeypatch, pwfile):
    """The library path (Spark source, scripts): DCPTOOL_PASSWORD_FILE when no password."""
    from dcptool.client.options import ConnOptions
    from dcptool.errors import UsageError

    monkeypatch.delenv("DCPTOOL_PASSWORD", raising=False)
    monkeypatch.setenv("DCPTOOL_PASSWORD_FILE", str(pwfile))
    o = ConnOptions.from_cli("127.0.0.1:11210", None, None, prompt=False)
    assert o.password == PW and PW not in repr(o)
    assert ConnOptions.from_cli("127.0.0.1:11210", None, "given", prompt=False).password == "given"
    monkeypatch.setenv("DCPTOOL_PASSWORD_FILE", "/nonexistent/pw")
    with pytest.raises(UsageError, match="DCPTOOL_PASSWORD_FILE /nonexistent/pw"):
        ConnOptions.from_cli("127.0.0.1:11210", None, None, prompt=False)
