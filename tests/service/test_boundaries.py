"""Imports point down the architecture's picture: service → worker → job process → engine.

The API never imports the worker; the job process (which runs the user's model) imports nothing of
the API or the worker, so it cannot hold their settings or secrets; the engine imports none of them.
The service may import the job process's torch-free modules (the job-kind table, the launcher).
"""

from __future__ import annotations

import ast

import pytest

from tests.service.support import ROOT

# package -> the packages of this repo it must never import
FORBIDDEN = {"service": {"worker"}, "job_process": {"service", "worker"},
             "amct_engine": {"service", "worker", "job_process"}}


def _imported_packages(path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):  # function-level imports count too
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down(package):
    crossings = {str(path.relative_to(ROOT)): sorted(_imported_packages(path) & FORBIDDEN[package])
                 for path in sorted((ROOT / package).rglob("*.py"))}
    assert {path: bad for path, bad in crossings.items() if bad} == {}
