"""Imports point down the architecture's picture, and no module imports itself back through others.

docs/architecture.md, "Import rules": the API (service/) and the workers (worker/) share core/ and never
import each other; both start job processes through job_host/ (torch-free: the contract and the sandbox),
which imports neither, nor the job process; the job process (job_process/, which runs the user's model)
imports nothing of the API, the worker or core, so it cannot hold their settings or secrets; the engine
imports none of them, and inside the engine export/ builds on quant/, never the reverse. Imports inside
functions count: a lazy import is still a dependency, and a lazy circle is still a circle.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("amct_engine", "core", "service", "worker", "job_host", "job_process", "examples", "bench")
# importer (a package or subpackage) -> what it must never import
FORBIDDEN = {
    "core": ("service", "worker", "job_process", "bench", "examples"),
    "service": ("worker", "job_process", "bench"),
    "worker": ("service", "job_process", "bench"),
    "job_host": ("core", "service", "worker", "job_process", "bench", "examples"),
    "job_process": ("core", "service", "worker", "bench", "examples"),
    "amct_engine": ("core", "service", "worker", "job_host", "job_process", "examples", "bench"),
    "amct_engine.quant": ("amct_engine.export",),
    "examples": ("core", "service", "worker", "bench"),
}
# The programs each side runs (what `celery -A`, `python -m` and the `amct` script load): an entry point's own
# imports are checked with the rest of its package, and each is imported in a fresh process below.
ENTRY_POINTS = (
    "worker.main",
    "service.cli",
    "job_process.main",
    "job_process.validate_model",
    "job_process.validate_llm",
)  # (service.__main__ runs the CLI)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for package in PACKAGES
        for p in (REPO / package).rglob("*.py")
        if not p.name.endswith("_pb2.py")
    }


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The repo modules `path` imports anywhere in its body (resolved to the longest known module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
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
            if target and target != name:
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("importer", sorted(FORBIDDEN))
def test_imports_point_down(graph, importer):
    crossings = {
        module: sorted(t for t in targets if any(_within(t, f) for f in FORBIDDEN[importer]))
        for module, targets in graph.items()
        if _within(module, importer)
    }
    assert {module: bad for module, bad in crossings.items() if bad} == {}


def test_no_module_imports_itself_back(graph):
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> None:
        assert module not in stack, "import circle: " + " -> ".join([*stack[stack.index(module) :], module])
        if module in done:
            return
        for target in sorted(graph[module]):
            # A package's __init__ is imported before its submodules anyway; a submodule naming its
            # package (`from amct_engine import registry`) is not a circle through the __init__'s body.
            if not _within(module, target):
                visit(target, [*stack, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize(
    "modules",
    [
        "amct_engine.config.cfg_loader, amct_engine.config.cfg_checks, amct_engine.config.quant_json, "
        "amct_engine.config.resolve, amct_engine.config.layer_refs",  # the API parses cfgs without torch
        "service.app, service.cli, job_host.kinds, amct_engine.export.formats, amct_engine.quant.registry",
        "worker.main, job_host.launcher, job_host.spec, core.reaper",  # the worker loads no model
        "job_process.main",  # the job process imports torch lazily, after its sandbox is set up
    ],
)
def test_these_modules_load_without_torch(modules):
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, 'torch was imported'"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_imports(graph, entry):
    assert entry in graph, f"{entry} is not a module of {PACKAGES}"
    code = f"import {entry}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
