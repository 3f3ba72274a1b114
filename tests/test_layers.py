"""The house's layering (docs/design.md), checked on every import in dcptool/.

Every `import` and `from ... import` counts, at module level or inside a function (an
import deferred to run time is still a dependency). Three rules:

1. A module imports only modules of its own package or of the layers below it. The
   layers, from the bottom: the base modules (errors, faults, runlog, procs, logsafe), protocol/,
   then client/, archive/ and node/ side by side (none imports another, except that the
   node's replication consumer is a DCP client), pipeline/, dcptool.spark, cli/.
   Imports under `if TYPE_CHECKING:` (annotations only) do not count for this rule.
2. No import cycle between modules, those under `if TYPE_CHECKING:` included (an
   annotation naming its owner's class is a back pointer all the same), except the typer
   registration in cli/ (app.py imports the command modules by name, those a command line
   needs, and they import app for the shared context).
3. No module uses another module's private names (`_x`): not by `from m import _x`, nor
   as `m._x` on a module it imported. What is shared is named publicly.
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
#: the high watermark table's replication, the collections manifest sent to members, the
#: buckets created, dropped and mapped on every member): the one
#: allowed crossing between siblings
NODE_CLIENT_USERS = {"dcptool.node.replication", "dcptool.node.takeover",
                     "dcptool.node.manifestshare", "dcptool.node.bucketshare",
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


def _parse(module: str, path: Path, *, annotations: bool) -> tuple[ast.Module, str]:
    """The module's syntax tree (without its `if TYPE_CHECKING:` blocks unless
    `annotations`) and the package its relative imports start from."""
    tree = ast.parse(path.read_text(), str(path))
    if not annotations:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return tree, package


def _source_of(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a `from ... import` reads from."""
    if node.level:
        base = package.split(".")
        base = base[:len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def imports_of(module: str, path: Path, known: set[str], *,
               annotations: bool = False) -> set[str]:
    """The dcptool modules `module` imports (a name imported from a package counts as
    its submodule when there is one). `annotations`: count the imports under
    `if TYPE_CHECKING:` too."""
    tree, package = _parse(module, path, annotations=annotations)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dcptool":
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            target = _source_of(node, package)
            if target.split(".")[0] != "dcptool":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & known
            out |= subs
            if len(subs) < len(node.names):
                out.add(target)
    out.discard(module)
    return {m for m in out if m in known}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(module: str, path: Path, known: set[str]) -> list[str]:
    """Where `module` uses a private name of another dcptool module: `from m import _x`,
    or `m._x` where `m` names a module it imported (`import dcptool.m as m`,
    `from dcptool import m`). Imports under `if TYPE_CHECKING:` count too."""
    tree, package = _parse(module, path, annotations=True)
    out: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the dcptool module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            target = _source_of(node, package)
            if target.split(".")[0] != "dcptool" or target == module:
                continue
            for a in node.names:
                if f"{target}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
                elif _private(a.name):
                    out.append(f"{module}:{node.lineno} imports {a.name} from {target}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases
                and aliases[node.value.id] != module):
            out.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return out


def graph(*, annotations: bool = False) -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known, annotations=annotations) for m, p in mods.items()}


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


def _without_cli_registration(g: dict[str, set[str]]) -> dict[str, set[str]]:
    # the typer registration: cli.app imports the command modules (by name) to register them
    for dep in list(g.get("dcptool.cli.app", ())):
        if dep.startswith("dcptool.cli."):
            g["dcptool.cli.app"].discard(dep)
    return g


def test_no_import_cycles_but_the_cli_registration():
    cycles = _cycles(_without_cli_registration(graph()))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_import_cycles_through_type_checking_imports_either():
    cycles = _cycles(_without_cli_registration(graph(annotations=True)))
    assert not cycles, ("import cycles (with the imports under `if TYPE_CHECKING:`):\n"
                        + "\n".join(" <-> ".join(c) for c in cycles))


def test_no_module_uses_another_modules_private_names():
    mods = modules()
    known = set(mods)
    found = [u for m, p in mods.items() for u in private_uses(m, p, known)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


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


def _write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    """A throwaway package `dcptool.fake` under `root`: module name -> its file."""
    out = {}
    for name, text in files.items():
        path = root / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        out[name] = path
    return out


def test_the_checker_finds_a_cycle_through_type_checking_imports(tmp_path):
    files = _write_package(tmp_path, {
        "dcptool.fake.__init__": "",
        "dcptool.fake.owner": "from .part import Part\n\nclass Owner:\n    part: Part\n",
        "dcptool.fake.part": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .owner import Owner\n\n"
                              "class Part:\n    owner: 'Owner'\n"),
    })
    mods = {n.removesuffix(".__init__"): p for n, p in files.items()}
    known = set(mods)
    plain = {m: imports_of(m, p, known) for m, p in mods.items()}
    full = {m: imports_of(m, p, known, annotations=True) for m, p in mods.items()}
    assert _cycles(plain) == []
    assert _cycles(full) == [["dcptool.fake.owner", "dcptool.fake.part"]]


@pytest.mark.parametrize("source, expected", [
    ("from .other import _hidden\n", ["imports _hidden from dcptool.fake.other"]),
    ("from dcptool.fake.other import shown, _hidden\n",
     ["imports _hidden from dcptool.fake.other"]),
    ("def f():\n    from .other import _hidden\n", ["imports _hidden from dcptool.fake.other"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .other import _Hidden\n",
     ["imports _Hidden from dcptool.fake.other"]),
    ("from . import other\nx = other._hidden\n", ["uses dcptool.fake.other._hidden"]),
    ("import dcptool.fake.other as o\nx = o._hidden()\n", ["uses dcptool.fake.other._hidden"]),
    ("from .other import shown\nfrom . import other\nx = other.shown, other.__doc__\n", []),
    ("class A:\n    def f(self):\n        return self._own\n", []),
])
def test_the_checker_finds_private_names_used_across_modules(tmp_path, source, expected):
    files = _write_package(tmp_path, {"dcptool.fake.__init__": "",
                                      "dcptool.fake.other": "shown = _hidden = 1\n",
                                      "dcptool.fake.mod": source})
    known = {"dcptool.fake", "dcptool.fake.other", "dcptool.fake.mod"}
    found = private_uses("dcptool.fake.mod", files["dcptool.fake.mod"], known)
    assert [f.split(" ", 1)[1] for f in found] == expected
