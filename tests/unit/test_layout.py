"""The package's shape: imports run one way (no cycle, function-level imports included), modules stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "kvstudy"
MAX_LINES = 600

# Layers from the bottom up: a module may import only from its own layer or those below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "io", "machine", "redact"),
    ("capture", "gpu_catalog"),
    ("vllm",),
    ("model",),
    ("tools",),
    ("run_record",),
    ("speed", "accuracy", "context", "precision"),
    ("notebook", "profiles"),
    ("render", "report_index", "report_html", "profile_new"),
    ("cli",),
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
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


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _layer(module: str) -> int:
    top = module.split(".")[1] if module.count(".") else ""
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
