"""`dcptool engine start|stop|status`: a Spark engine that the Spark commands attach to.

See dcptool/pipeline/engine.py: the engine is a long-running Spark driver (its JVM, its
SparkContext and warm Python workers); `backup`, `restore`, `merge`, `verify --against`,
`export` and `quickstart` submit their jobs to it when it runs, and skip Spark's start-up.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from dcptool.cli import output
from dcptool.cli.app import app
from dcptool.cli.options import MasterOpt
from dcptool.cli.manual import manual
from dcptool.errors import DcptoolError
from dcptool import procs
from dcptool.procs import pid_alive

manual(
    "engine",
    exit_note="engine status: 1 when no engine runs. engine start: 1 when the engine did not "
              "come up (its log says why).",
    files=(("$DCPTOOL_ENGINE_DIR/engine.sock", "The engine's socket (the directory is private "
            "to the user: mode 0700)."),
           ("$DCPTOOL_ENGINE_DIR/engine.json", "The running engine's pid and master."),
           ("$DCPTOOL_ENGINE_DIR/engine.log", "Spark's own output, and the engine's errors.")),
    env=("DCPTOOL_ENGINE", "DCPTOOL_ENGINE_DIR"),
    see_also=("backup", "restore", "export"),
)

engine_app = typer.Typer(
    name="engine",
    help="""Keep Spark running between commands, so they skip its start-up.

    A Spark command (backup, restore, merge, verify --against, export) spends seconds starting
    a JVM and Python workers before its first task. `dcptool engine start` starts them once, in
    the background; while the engine runs, those commands attach to it and submit their jobs
    there (each in a job group of its own; Ctrl-C or the end of a command cancels its jobs).
    A command given a --master other than the engine's starts its own Spark, and so does
    every command with DCPTOOL_ENGINE=off. An engine runs the dcptool it was started with: after
    an upgrade, commands start their own Spark (and say so) until the engine is restarted.

    Example: dcptool engine start
    """,
    no_args_is_help=True,
)
app.add_typer(engine_app, name="engine")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def _dir() -> Path:
    from dcptool.pipeline.engine import engine_dir

    return engine_dir()


def _status_line(st: dict) -> str:
    served = st["commands_served"]
    return (f"engine running: pid {st['pid']}, master {st['master']} ({st['parallelism']} "
            f"cores), up {output.rough_duration(st['uptime_s'])}, {served} command{'s' * (served != 1)} "
            f"served, {st['commands_running']} running")


@engine_app.command("start")
def start(
    master: MasterOpt = None,
    foreground: Annotated[bool, typer.Option(
        "--foreground", help="Run the engine in this process until Ctrl-C or SIGTERM (for a "
                             "service manager), instead of in the background.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, metavar="SECONDS",
        help="How long to wait for the engine to be ready.")] = 180,
    json_out: JsonOpt = False,
) -> None:
    """Start a Spark engine in the background and wait until it is ready.

    It runs local[*] (or --master), keeps its Python workers warm, and serves the Spark commands
    of this user (its socket is in DCPTOOL_ENGINE_DIR, default $XDG_RUNTIME_DIR/dcptool-engine or
    ~/.cache/dcptool/engine). Starting an engine that already runs does nothing.

    Example: dcptool engine start --master spark://10.0.0.5:7077
    """
    from dcptool.pipeline import engine, runtime

    directory = _dir()
    st = engine.request("status", directory, timeout=5.0)
    if st is not None:
        if json_out:
            output.print_json({**st, "already_running": True, "start_s": 0.0})
        else:
            output.note(_status_line(st) + " (already running)")
        return
    engine.prepare_dir(directory)
    runtime.check_master(master)
    if foreground:
        def ready(status: dict) -> None:
            if json_out:
                output.print_json({**status, "already_running": False,
                                   "start_s": status["ready_s"]})
            else:
                output.note(_status_line(status) + f" (ready in {status['ready_s']:.1f} s; "
                            "Ctrl-C stops it)")

        from dcptool.pipeline.enginehost import serve

        try:
            serve(directory, master, ready=ready)
        except KeyboardInterrupt:
            pass
        return
    t0 = time.monotonic()
    log = directory / engine.LOG
    cmd = [sys.executable, "-m", "dcptool", "-q", "engine", "start", "--foreground"]
    if master:
        cmd += ["--master", master]
    # a long-lived process: no password or passphrase in its environment (each attached
    # command's tasks carry their own connection options and data keys)
    env = procs.child_env(DCPTOOL_SPARK_LOG=str(log))
    with open(log, "ab") as sink:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                env=env, start_new_session=True, cwd="/")
    spinner = output.console(stderr=True).status(
        "starting the engine (Spark, Python workers)", spinner="dots") \
        if output.show_progress() else contextlib.nullcontext()
    with spinner:
        while True:
            st = engine.request("status", directory, timeout=5.0)
            if st is not None:
                break
            if proc.poll() is not None:
                raise DcptoolError(f"the engine did not start (exit status {proc.returncode})",
                                   hint=f"its log says why: {log}")
            if time.monotonic() - t0 > timeout:
                proc.kill()
                raise DcptoolError(f"the engine was not ready after {timeout:.0f} s",
                                   hint=f"see {log}")
            time.sleep(0.1)
    st.update(already_running=False, start_s=round(time.monotonic() - t0, 2))
    if json_out:
        output.print_json(st)
    else:
        output.note(_status_line(st) + f" (started in {st['start_s']:.1f} s)")


@engine_app.command("stop")
def stop(
    now: Annotated[bool, typer.Option(
        "--now", help="Cancel the commands running on the engine (their archives stay "
                      "resumable) instead of waiting for them to end.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, metavar="SECONDS",
        help="How long to wait for the engine to end; then it is killed.")] = 600,
    json_out: JsonOpt = False,
) -> None:
    """Stop the engine: once the commands running on it have ended (--now: cancel them).

    Stopping when no engine runs does nothing.

    Example: dcptool engine stop --now
    """
    import signal

    from dcptool.pipeline import engine

    directory = _dir()
    st = engine.request("status", directory, timeout=5.0)
    if st is None:
        if json_out:
            output.print_json({"running": False, "stopped": False})
        else:
            output.note("no engine is running")
        return
    pid = int(st["pid"])
    if st["commands_running"] and not now:
        output.note(f"waiting for {st['commands_running']} running command(s) to end "
                    "(--now cancels them)")
    engine.request("stop", directory, timeout=60.0, now=now)
    t0 = time.monotonic()
    while pid_alive(pid):
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    if json_out:
        output.print_json({"running": False, "stopped": True, "pid": pid})
    else:
        output.note(f"engine stopped (pid {pid})")


@engine_app.command("status")
def status(json_out: JsonOpt = False) -> None:
    """Whether an engine runs, with its pid, master, uptime and the commands it served.

    Exit status 1 when no engine runs.

    Example: dcptool engine status --json
    """
    from dcptool.pipeline import engine

    st = engine.request("status", _dir(), timeout=5.0)
    if json_out:
        output.print_json(st or {"running": False})
    elif st is None:
        typer.echo("no engine is running")
    else:
        typer.echo(_status_line(st))
    if st is None:
        raise typer.Exit(1)

