"""The house's layering (docs/design.md), checked on every import in dcptool/.

Every `import` and `from ... import` counts, at module level or inside a function (an
import deferred to run time is still a dependency), except those under
`if TYPE_CHECKING:` (annotations only). Two rules:

1. A module imports only modules of its own package or of the layers below it. The
   layers, from the bottom: the base modules (errors, faults, runlog, procs, logsafe), protocol/,
   then client/, archive/ and node/ side by side (none imports another, except that the
   node's replication consumer is a DCP client), pipeline/, dcptool.spark, cli/.
2. No import cycle between modules, except the typer registration in cli/ (app.py
   imports the command modules, which import app for the shared context).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dcptool"

BASE = {"dcptool", "dcptool.errors", "dcptool.faults", "dcptool.runlog", "dcptool.procs",
        "dcptool.logsafe"}
#: layer of each top-level part; parts on one level must not import each other
LEVEL = {"base": 0, "protocol": 1, "client": 2, "archive": 2, "node": 2, "pipeline": 3,
         "spark": 4, "cli": 5, "__main__": 6}
#: the node modules that run DCP client connections (replication and takeover streams,
#: the high watermark table's replication, the collections manifest sent to members): the one
#: allowed crossing between siblings
NODE_CLIENT_USERS = {"dcptool.node.replication", "dcptool.node.takeover",
                     "dcptool.node.manifestshare",
                     "dcptool.node.hwtrepl"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    if module in BASE:
        return "base"
    return module.split(".")[1]


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The dcptool modules `module` imports (a name imported from a package counts as
    its submodule when there is one)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    out: set[str] = set()
    # imports for type annotations only (`if TYPE_CHECKING:`) are not dependencies
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dcptool":
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "dcptool":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & known
            out |= subs
            if len(subs) < len(node.names):
                out.add(target)
    out.discard(module)
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def test_every_import_goes_down_or_stays_in_its_package():
    wrong = []
    for mod, deps in sorted(graph().items()):
        here = part_of(mod)
        for dep in sorted(deps):
            there = part_of(dep)
            if there == here or here == "base" and there == "base":
                continue
            if here == "node" and there == "client" and mod in NODE_CLIENT_USERS:
                continue
            if LEVEL[there] >= LEVEL[here]:
                wrong.append(f"{mod} imports {dep}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_but_the_cli_registration():
    g = graph()
    # the typer registration: cli.app imports every command module to register it
    for dep in list(g.get("dcptool.cli.app", ())):
        if dep.startswith("dcptool.cli."):
            g["dcptool.cli.app"].discard(dep)
    cycles = _cycles(g)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("source, expected", [
    ("from . import x", {"dcptool.node.x"}),
    ("from ..protocol import frame", {"dcptool.protocol.frame"}),
    ("import dcptool.errors", {"dcptool.errors"}),
    ("def f():\n    from dcptool.client import position\n", {"dcptool.client.position"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import x\n", set()),
])
def test_the_checker_sees_relative_and_deferred_imports(tmp_path, source, expected):
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = {"dcptool.node.x", "dcptool.protocol.frame", "dcptool.errors",
             "dcptool.client.position", "dcptool.protocol", "dcptool.client"}
    assert imports_of("dcptool.node.mod", path, known) == expected


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
