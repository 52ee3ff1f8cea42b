"""What a benchmark run's numbers were measured on: the machine (CPU, its ISA flags, cores, memory, OS, load)
and the source revision (bench/run_all.py writes both into the report's header)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.common import isa_flags

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        ram_gib = round(kib / 1024 / 1024, 1)
    except (OSError, StopIteration):
        pass
    os_name = platform.platform()
    try:
        release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
        os_name = f"{release.get('PRETTY_NAME', '').strip(chr(34))} (kernel {platform.release()})"
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "ram_gib": ram_gib,
        "os": os_name,
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
        "isa": isa_flags(),
    }


def git_revision() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        # The report and plots are this command's own output: a previous run leaves them modified.
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!docs/benchmarks.md",
                ":!docs/images",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
