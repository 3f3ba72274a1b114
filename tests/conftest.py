"""Shared test fixtures."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: the frames real DCP clients sent, kept with the tests (tests/vectors/README.md)
VECTORS = REPO / "tests" / "vectors"


def vector_files() -> list[Path]:
    """The captured `*.requests.hex` files; none found is an error, never an empty (skipped)
    set of tests."""
    files = sorted(VECTORS.glob("*.requests.hex"))
    if not files:
        pytest.fail(f"no captured client vectors (*.requests.hex) in {VECTORS}", pytrace=False)
    return files


def pytest_configure(config):
    # a dcptool engine the developer runs must not serve the tests' commands (nor the
    # in-process SparkSession): every test run has an engine directory of its own, empty
    # unless a test starts an engine there
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="dcptool-test-engine-")
    os.environ["DCPTOOL_ENGINE_DIR"] = d
    os.environ.pop("DCPTOOL_ENGINE", None)
    # the tests of one bucket's commands name it: `backup ARCHIVE` without -b makes a
    # cluster archive of every bucket; the tests of that (cluster archives, the README's
    # tour) take DCPTOOL_BUCKET out of their commands' environment
    os.environ["DCPTOOL_BUCKET"] = "default"
    # the manifests commands read and checked are kept in the run's own directory, not the
    # user's cache (archive/manifestcache.py); the tests of the cache name theirs
    os.environ["DCPTOOL_MANIFEST_CACHE"] = os.path.join(d, "manifests")
    # the run's encrypted archives get cheap key files (scrypt N=2^10, not 2^17: 0.45 CPU s
    # each time one is made or opened); the tests of the real cost take this out
    os.environ["DCPTOOL_TESTONLY_WEAKEN_KDF"] = "1"

    def cleanup() -> None:
        if os.path.exists(os.path.join(d, "engine.sock")):  # a test's engine left running
            import subprocess
            import sys

            subprocess.run([sys.executable, "-m", "dcptool", "engine", "stop", "--now",
                            "--timeout", "30"], env=dict(os.environ, DCPTOOL_ENGINE_DIR=d),
                           capture_output=True, timeout=60)
        shutil.rmtree(d, ignore_errors=True)

    config.add_cleanup(cleanup)
    _cache_bytecode(config)
    _terminal_env_of_the_controller(config)
    # nodes and `run_cli` commands are forked from a warm dcptool (tests/zygote.py)
    import nodeprocutil
    import zygote

    nodeprocutil.LAUNCH = zygote.popen


#: the modules whose tests read what a process is from outside (its command line, its
#: environment in /proc, process listings): their `python -m dcptool` processes are real
#: interpreters, never forked by the zygote
REAL_PROCESSES = (
    "tests/cli/test_engine.py",
    "tests/cli/test_quiet_spark.py",
    "tests/pipeline/test_spark_start.py",
    "tests/security/test_child_env.py",
    "tests/security/test_secrets.py",
)


@pytest.fixture(scope="module", autouse=True)
def _real_processes_where_they_are_looked_at(request):
    path = Path(str(request.node.path)).resolve().relative_to(REPO).as_posix()
    if path not in REAL_PROCESSES:
        yield
        return
    before = os.environ.get("DCPTOOL_TEST_ZYGOTE")
    os.environ["DCPTOOL_TEST_ZYGOTE"] = "0"
    yield
    if before is None:
        os.environ.pop("DCPTOOL_TEST_ZYGOTE", None)
    else:
        os.environ["DCPTOOL_TEST_ZYGOTE"] = before


#: what an xdist worker's environment gets that the run's own did not have: GNU readline,
#: loaded in the worker, sets COLUMNS and LINES (80x24), and a command run with them lays
#: its tables out for 80 columns instead of a pipe's 200
_TERMINAL_ENV = ("COLUMNS", "LINES")


#: the modules that take longest (whole minutes of end-to-end scenarios, measured with
#: --durations), longest first: started first, so that two workers do not end with one of
#: them alone on a long module while the other has nothing left
LONGEST_FIRST = (
    "tests/cli/test_engine.py",
    "tests/cluster/test_spark_standalone.py",
    "tests/pipeline/test_continuous_backup.py",
    "tests/cli/test_progress_numbers.py",
    "tests/cli/test_s3_cli.py",
    "tests/cluster/test_cluster_continuous.py",
    "tests/cli/test_quiet_spark.py",
    "tests/test_readme.py",
    "tests/faults/test_soak.py",
    "tests/security/test_child_env.py",
    "tests/pipeline/test_stream.py",
    "tests/cli/test_cluster_archive_cli.py",
    "tests/cli/test_encrypted_cli.py",
    "tests/security/test_secrets.py",
    "tests/pipeline/test_spark_start.py",
    "tests/cli/test_help.py",
    "tests/cli/test_cluster_read_cli.py",
    "tests/cluster/test_doc_cluster.py",
    "tests/cli/test_cluster_prune_cli.py",
    "tests/security/test_permissions.py",
    "tests/security/test_role_preflight.py",
    "tests/cli/test_point_in_time_cli.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest modules first (LONGEST_FIRST), then the others in their order; the tests
    of a module keep theirs."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """(pytest-xdist, in the controller) modules that mostly wait run beside modules that
    keep the CPUs busy (tests/pairing.py)."""
    import pairing

    return pairing.make_scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(pytest-xdist, in the controller) tell each worker the run's own COLUMNS and LINES."""
    node.workerinput["dcptool_terminal_env"] = {k: os.environ.get(k) for k in _TERMINAL_ENV}


def _terminal_env_of_the_controller(config) -> None:
    """In an xdist worker: COLUMNS and LINES as the run that started it had them."""
    given = getattr(config, "workerinput", {}).get("dcptool_terminal_env")
    if given is None:
        return
    for k, v in given.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _cache_bytecode(config) -> None:
    """With PYTHONDONTWRITEBYTECODE set, every `python -m dcptool` the tests start (commands,
    nodes, Spark's Python workers) would compile dcptool and what it imports from source
    again, and this process would rewrite the assertions of every test module again (some
    20 s of a run, in each xdist worker): give the tests' processes, this one included, a
    bytecode cache in a directory of the user's under the temporary directory, kept from run
    to run (Python and pytest check each file against its source), so nothing is written
    into the checkout or the installed packages."""
    import sys
    import tempfile

    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    d = Path(tempfile.gettempdir()) / f"dcptool-test-pycache-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        if d.is_symlink() or d.stat().st_uid != os.getuid():
            return
    except OSError:
        return
    os.environ["PYTHONPYCACHEPREFIX"] = str(d)
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    # the same for this process from here on: the test modules pytest rewrites, and the
    # modules they import
    sys.pycache_prefix = str(d)
    sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _process_wide_output_as_at_start():
    """A command run in-process (`cli(...)`, `main([...])`) sets process-wide output state:
    verbosity (and with it the run logs' echo on stderr) and JSON errors. Each test starts
    from the defaults, whatever ran before it on the same worker."""
    from dcptool.cli import output

    output.set_verbosity(output.NORMAL)
    output.set_json_errors(False)
    yield
    output.set_verbosity(output.NORMAL)
    output.set_json_errors(False)


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    vector_files()
    return VECTORS


@pytest.fixture(scope="session")
def spark():
    """The one local SparkSession of the test run (Spark start-up costs seconds). Its JVM
    takes the flags dcptool's own commands start theirs with (`runtime.JVM_FLAGS`: the
    client compiler only, the serial collector), not the full JIT of the long-running
    engine: the run's jobs are many and small."""
    from dcptool.pipeline import runtime

    session = runtime.get_spark("local[2]", app_name="dcptool-tests", conf={
        "spark.driver.extraJavaOptions": " ".join(
            [f"-Dlog4j.configurationFile=file:{runtime.LOG4J_PROPERTIES}", *runtime.JVM_FLAGS])})
    yield session
    session.stop()


# -- a warm Spark engine --------------------------------------------------------------------

#: what the shared engine's process never gets from the test process's environment: secrets,
#: object-store credentials, fault injection, a master (its executors would otherwise carry
#: whatever the test that happened to start it had set)
_ENGINE_ENV_DROPPED = ("AWS_", "DCPTOOL_S3_", "DCPTOOL_PASSWORD", "DCPTOOL_ARCHIVE_",
                       "DCPTOOL_FAULT", "DCPTOOL_SPARK_", "DCPTOOL_ENGINE", "NO_COLOR")


@pytest.fixture(scope="session")
def warm_engine(s3_server):
    """One `dcptool engine` (a Spark driver with its Python workers warmed up) for the test
    run, or for each xdist worker, started when a test first asks for it, in a directory of
    its own (never the run's DCPTOOL_ENGINE_DIR, which other tests' commands use): its path.
    A command attaches to it only where `on_engine` points DCPTOOL_ENGINE_DIR at it.

    Its executors have the run's S3 server's endpoint and credentials (`s3_server`, and
    never a test's own), as a cluster's machines are given theirs: commands on archives in
    that server's buckets run on it too."""
    import shutil
    import subprocess
    import sys
    import tempfile

    d = tempfile.mkdtemp(prefix="dcpeng-")  # short: a Unix socket's path has a length limit
    env = {k: v for k, v in os.environ.items() if not k.startswith(_ENGINE_ENV_DROPPED)}
    env.update({k: v for k, v in s3_server.env().items() if k.startswith("AWS_")})
    env["DCPTOOL_ENGINE_DIR"] = d

    def engine(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dcptool", "engine", *args], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=300)

    r = engine("start")
    if r.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.fail(f"dcptool engine start failed: {r.stderr}", pytrace=False)
    yield d
    engine("stop", "--now", "--timeout", "30")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def on_engine(warm_engine, monkeypatch):
    """This test's `python -m dcptool` commands (those started with os.environ, or an env
    made from it, after this fixture) run their Spark jobs on `warm_engine` instead of
    starting a JVM each: for tests of what a command does, not of how Spark starts. Not for a
    test whose commands give their Spark tasks something through the environment (fault
    injection, S3 credentials other than `s3_server`'s, a umask), count processes or time
    Spark's start."""
    monkeypatch.setenv("DCPTOOL_ENGINE_DIR", warm_engine)
    monkeypatch.delenv("DCPTOOL_ENGINE", raising=False)
    return warm_engine


# -- reference node fixtures -------------------------------------------------------------


@pytest.fixture
def node_factory(tmp_path):
    """Make `tests.nodeprocutil.NodeProcess` objects in a temporary directory; all are stopped
    at the end of the test. `make(name="node", start=True, **kwargs)`."""
    from nodeprocutil import NodeProcess

    made = []

    def make(name: str = "node", *, start: bool = True, **kwargs):
        n = NodeProcess(tmp_path / name, **kwargs)
        made.append(n)
        if start:
            n.start()
        return n

    yield make
    for n in made:
        try:
            n.stop(timeout=15)
        except Exception:  # pragma: no cover - teardown must go on
            n.kill()


@pytest.fixture(scope="module")
def module_node_factory(tmp_path_factory):
    """`node_factory` for module-scoped fixtures: the nodes run until the module's last test
    (for tests that only read what the fixture set up)."""
    from nodeprocutil import NodeProcess

    made = []
    base = tmp_path_factory.mktemp("module-nodes")

    def make(name: str = "node", *, start: bool = True, **kwargs):
        n = NodeProcess(base / name, **kwargs)
        made.append(n)
        if start:
            n.start()
        return n

    yield make
    for n in made:
        try:
            n.stop(timeout=15)
        except Exception:  # pragma: no cover - teardown must go on
            n.kill()


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory):
    """One running node (16 vbuckets) shared by the tests of a module."""
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path_factory.mktemp("shared-node") / "node", vbuckets=16)
    n.start()
    yield n
    n.stop(timeout=15)


# -- object storage ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One S3-compatible server process (SeaweedFS) for the test run, started when a test
    first asks for it; see tests/s3util.py."""
    from s3util import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """This process set up for `s3_server` (endpoint and credentials in the environment, no
    S3 client cached from before) and a new empty bucket: (server, bucket)."""
    from dcptool.archive.stores.s3 import CLIENTS
    from s3util import aim_at

    aim_at(monkeypatch, s3_server)
    yield s3_server, s3_server.new_bucket()
    CLIENTS.clear()
