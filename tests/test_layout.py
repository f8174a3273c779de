"""The shape of the code that the redesign promised (docs/layout.md): no import cycle in src/, no
private name imported from another module, no environment asked by getattr what it can do.

Read from the source with ``ast``, so each check names the file and line that breaks it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "virtlab"


def modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package."""
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The package's modules that ``name`` imports at run time (at module level or inside a
    function; not under ``if TYPE_CHECKING``), with the line of each import."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = {id(n) for node in ast.walk(tree) if _type_checking_only(node) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from a import b`: module a.b when it is one (not a's __init__), else module a.
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                if target in known:
                    found.append((target, node.lineno))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    found = modules()
    return {name: dict(imports_of(name, path, set(found))) for name, path in found.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}, "c": {"b": 1}}) == []


def test_imports_are_resolved_to_modules(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "from virtlab.export import charts\n"
        "from virtlab.plan import Plan\n"
        "if TYPE_CHECKING:\n    from virtlab.runner_like import X\n"
        "def f():\n    from virtlab.store import ResultStore\n"
    )
    known = {
        "virtlab.export",
        "virtlab.export.charts",
        "virtlab.plan",
        "virtlab.runner_like",
        "virtlab.store",
    }
    assert dict(imports_of("virtlab.mod", path, known)) == {
        "virtlab.export.charts": 2,
        "virtlab.plan": 3,
        "virtlab.store": 7,
    }


def test_no_import_cycle_in_src():
    graph = import_graph()
    found = cycles(graph)
    shown = [
        "; ".join(
            f"{m} imports {t} (line {line})" for m in group for t, line in graph[m].items() if t in group
        )
        for group in found
    ]
    assert not found, "import cycles:\n" + "\n".join(shown)


def private_imports() -> list[str]:
    found = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(
                            f"{path.relative_to(SRC)}:{node.lineno}: {alias.name} from {node.module}"
                        )
    return found


def test_no_private_name_is_imported_from_another_module():
    assert private_imports() == []


PROBED = re.compile(r"\b(options|environment|environments|env|template|member)\b")


def environment_probes() -> list[str]:
    """``getattr``/``hasattr`` on an environment or its options outside ``virtlab.environments``:
    an environment declares what it offers, nobody asks it by attribute name."""
    found = []
    for name, path in modules().items():
        if name.startswith(f"{PACKAGE}.environments"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and PROBED.search(ast.unparse(node.args[0]))
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    ("code", "probe"),
    [
        ('getattr(env.options, "vcpus", None)', True),
        ('hasattr(environment, "qemu_pid")', True),
        ('getattr(error, "log", "")', False),
    ],
)
def test_the_probe_finder_tells_a_probe_from_other_getattr(tmp_path, monkeypatch, code, probe):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(f"def f(env, environment, error):\n    return {code}\n")
    monkeypatch.setattr(f"{__name__}.SRC", tmp_path)
    assert bool(environment_probes()) is probe


def test_no_environment_is_probed_with_getattr():
    assert environment_probes() == []
