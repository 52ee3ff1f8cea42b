"""quant/ and export/ import one way: export uses the quantisation math, never the reverse, and no
module of either package imports itself back through others (imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "amct_engine"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The amct_engine modules `path` imports anywhere in its body."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target not in (name, "amct_engine"):
                found.add(target)
    return found


def _import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    inside = {m for m in paths if m.startswith(packages)}
    return {m: _imports(paths[m], set(paths)) & inside for m in inside}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            cycle = visit(target, path + [module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def test_quant_never_imports_export():
    graph = _import_graph(("amct_engine.quant.", "amct_engine.export."))
    upward = {m: sorted(t for t in targets if t.startswith("amct_engine.export."))
              for m, targets in graph.items() if m.startswith("amct_engine.quant.")}
    assert {m: t for m, t in upward.items() if t} == {}


def test_quant_and_export_have_no_import_cycle():
    assert _cycle(_import_graph(("amct_engine.quant.", "amct_engine.export."))) is None
