"""The house's floors: each module imports only from its own layer or below, no import cycle exists, and no module
reaches into another's private names (`_x`).

Tests are exempt from the private-name rule: a test may pin the behaviour of a module's internals; product code
(helpers/, bench/) may not depend on them.
"""
from __future__ import annotations

import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
BENCH = HELPERS.parent / "bench"
# Ground floor first; a module may import its own floor or any floor below it.
LAYERS = {"config": 0, "record": 0, "paths": 0, "units": 0, "paired": 0, "wire": 0, "mindformers": 4, "run": 1, "spawn": 2, "tune": 3, "book": 4, "cli": 5,
          "__init__": 5, "__main__": 5, "folder_lock": 0, "docs_pages": 5, "bounded_yaml": 0, "levers": 0}


def module_name(path: Path) -> str:
    rel = path.relative_to(HELPERS.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else "__init__"]


def imports(path: Path) -> set[str]:
    """Every helpers.* module `path` imports, at top level or inside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("helpers")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            if not base.startswith("helpers"):
                continue
            for alias in node.names:  # `from helpers.run import train` names a module
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _exists(candidate) else base)
    return {m for m in found if _exists(m)}


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (HELPERS.parent / rel.with_suffix(".py")).is_file() or (HELPERS.parent / rel / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in HELPERS.rglob("*.py")}


def test_every_module_has_a_layer():
    for module in graph():
        assert layer(module) is not None, module


def test_no_import_from_a_higher_layer():
    upward = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
              for m, deps in graph().items() for d in deps
              if layer(d) > layer(m) and not d.startswith(m + ".")]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(g.get(node, ())):
            if dep == node or node.startswith(dep + ".") and dep.count(".") == 1:
                continue  # a sub-package's own __init__ and the package that holds it
            if state.get(dep) == 1:
                cycles.append(" → ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """The walk is real: an upward import written into a run module is reported."""
    bad = HELPERS / "run" / "_layer_probe.py"
    bad.write_text("from helpers.tune.rounds import Workbook\n", encoding="utf-8")
    try:
        deps = imports(bad)
        assert "helpers.tune.rounds" in deps
        assert layer("helpers.tune.rounds") > layer(module_name(bad))
    finally:
        bad.unlink()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(path: Path) -> list[str]:
    """Every private name of another helpers module that `path` imports (`from helpers.x import _y`) or reads
    through a module it imported (`x._y` after `from helpers import x` or `import helpers.x as x`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path) if path.is_relative_to(HELPERS) else ""
    modules: dict[str, str] = {}  # local name → the helpers module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("helpers.") and a.asname:
                    modules[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers") and not node.level:
            for a in node.names:
                if _exists(f"{node.module}.{a.name}"):
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
                elif _private(a.name) and node.module != here:
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and _private(node.attr) and modules[node.value.id] != here):
            found.append(f"{path.name}:{node.lineno} reads {modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    used = [use for path in [*HELPERS.rglob("*.py"), *BENCH.glob("*.py")] for use in private_uses(path)]
    assert not used, "\n".join(used)


def test_the_private_name_check_sees_both_forms():
    probe = HELPERS / "run" / "_private_probe.py"
    probe.write_text("from helpers.tune.autotune import _median_run\nfrom helpers.spawn import zygote\n"
                     "zygote._current = None\n", encoding="utf-8")
    try:
        assert private_uses(probe) == ["_private_probe.py:1 imports helpers.tune.autotune._median_run",
                                       "_private_probe.py:3 reads helpers.spawn.zygote._current"]
    finally:
        probe.unlink()
