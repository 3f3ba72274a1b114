"""How the xdist controller hands test modules to its workers: a module that mostly waits
beside one that keeps the CPUs busy.

With `--dist loadfile` a worker that runs short of work takes the next module of the
queue. The queue starts with the longest modules (conftest.LONGEST_FIRST), nearly all of
them Spark end-to-end scenarios that keep a core busy, and ends with node and tail tests
that mostly wait (on expiries, noop intervals, a node's restart): the first half of a run
had both cores saturated and the second half left them idle for long stretches. Here a
worker asking for work gets the first module of the queue of the kind the other workers
are not running (WAITING, or not), so the waiting modules run beside the busy ones, in
queue order within each kind; when one kind runs out, the queue's order alone decides.
"""
from __future__ import annotations

from typing import Any

#: the modules that spend most of their time waiting (measured: the CPU their test
#: processes used over their wall time, under 0.45 of a core)
WAITING = frozenset({
    "tests/faults/test_soak.py",
    "tests/cli/test_help.py",
    "tests/cli/test_tail.py",
    "tests/cli/test_tail_snappy.py",
    "tests/cli/test_tail_collections.py",
    "tests/security/test_node_attacker.py",
    "tests/security/test_role_preflight.py",
    "tests/cluster/test_move.py",
    "tests/node/test_eviction.py",
    "tests/node/test_node_limits.py",
    "tests/node/test_compaction.py",
    "tests/node/test_sdk_compat.py",
    "tests/node/test_node_docops.py",
    "tests/client/test_consumer_node.py",
    "tests/test_zygote.py",
})


def module_of(scope: str) -> str:
    return scope.split("::", 1)[0]


def make_scheduler(config: Any, log: Any) -> Any:
    """A LoadFileScheduling that pairs waiting modules with busy ones (None for any other
    --dist mode: xdist's own scheduler)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Paired(LoadFileScheduling):
        def _running(self, node: Any) -> list[str]:
            return [module_of(scope) for scope, tests in self.assigned_work.get(node, {}).items()
                    if not all(tests.values())]

        def _assign_work_unit(self, node: Any) -> None:
            others = [m for other in self.nodes if other is not node
                      for m in self._running(other)]
            want_waiting = bool(others) and not any(m in WAITING for m in others)
            scope = next((s for s in self.workqueue
                          if (module_of(s) in WAITING) == want_waiting), None)
            if scope is not None:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return Paired(config, log)
