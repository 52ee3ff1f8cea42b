"""amct_engine.config loads without torch (the API process parses cfgs without it), and its
modules import each other without a circle."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "amct_engine" / "config"


def test_config_modules_import_without_torch():
    code = (
        "import amct_engine.config.cfg_loader, amct_engine.config.cfg_checks, amct_engine.config.quant_json, "
        "amct_engine.config.resolve, amct_engine.config.layer_refs, sys; assert 'torch' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _config_imports(path: Path) -> set[str]:
    """Every amct_engine.config module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # from package import module
    modules = {f"amct_engine.config.{p.stem}" for p in CONFIG.glob("*.py")}
    return found & modules


def test_config_modules_import_each_other_without_a_circle():
    graph = {f"amct_engine.config.{p.stem}": _config_imports(p) for p in CONFIG.glob("*.py")}
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> None:
        assert module not in stack, " -> ".join([*stack[stack.index(module):], module])
        if module in done:
            return
        for imported in graph[module]:
            visit(imported, [*stack, module])
        done.add(module)

    for module in graph:
        visit(module, [])
