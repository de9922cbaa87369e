"""The package's shape: imports run one way (no cycle, function-level imports included), the experiments
stay apart, modules stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "kvstudy"
MAX_LINES = 600

# The experiments: one layer, and none of them imports another (what they share lives below them).
EXPERIMENTS = ("speed", "accuracy", "context", "precision", "load")

# Layers from the bottom up: a module may import only from its own layer or those below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "io", "formats", "limits", "outputs", "machine", "redact", "progress"),
    ("stats",),  # every statistical test and interval
    ("capture", "gpu_catalog"),
    ("vllm",),
    ("model",),
    ("tools",),
    ("run_record",),
    ("bench",),
    EXPERIMENTS,
    ("profiles", "decision_rule"),  # decision_rule: the card's one rule (profiles check its thresholds)
    ("distribute",),  # plans a profile's experiments as blocks, runs and collects them
    ("report",),  # report/: tables, notebook, html, render, design, calibration, decision
    ("cli",),  # entry: the kvstudy command, one module per noun
)


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every kvstudy module ``path`` imports, at any depth of the file (functions included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kvstudy")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvstudy") and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _top(module: str) -> str:
    """The subpackage (or top-level module) of ``kvstudy`` a module belongs to."""
    return module.split(".")[1] if module.count(".") else ""


def _layer(module: str) -> int:
    top = _top(module)
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module}: not in any layer of tests/unit/test_layout.py (add it where it belongs)")


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_imports_run_downward() -> None:
    upward = [
        f"{a} imports {b}"
        for a, targets in _graph().items()
        if a != "kvstudy"
        for b in targets
        if b != "kvstudy" and _layer(b) > _layer(a)
    ]
    assert not upward, "imports that run upward: " + "; ".join(sorted(upward))


def _between_experiments(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one experiment subpackage into another (each shares only the layers below it)."""
    return sorted(
        f"{a} imports {b}"
        for a, targets in graph.items()
        for b in targets
        if _top(a) in EXPERIMENTS and _top(b) in EXPERIMENTS and _top(a) != _top(b)
    )


def test_experiments_do_not_import_one_another() -> None:
    crossing = _between_experiments(_graph())
    assert not crossing, "experiments importing one another (move the shared code to bench/ or below): " + "; ".join(
        crossing
    )


def test_modules_stay_small() -> None:
    big = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_the_check_can_fail(tmp_path: Path) -> None:
    """The cycle finder sees a cycle hidden in a function body."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from kvstudy.b import x\n")
    assert "kvstudy.b" in _imports(a)


def test_the_experiment_check_can_fail(tmp_path: Path) -> None:
    """An experiment importing another, even inside a function, is found; importing the bench layer is not."""
    package = tmp_path / "kvstudy"
    for sub in ("bench", "context", "speed"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "bench" / "client.py").write_text("x = 1\n")
    (package / "speed" / "runner.py").write_text("from kvstudy.bench.client import x\n")
    (package / "context" / "sweep.py").write_text(
        "from kvstudy.bench.client import x\n\n\ndef f():\n    from kvstudy.speed.runner import x\n"
    )
    assert _between_experiments(_graph(package)) == ["kvstudy.context.sweep imports kvstudy.speed.runner"]
