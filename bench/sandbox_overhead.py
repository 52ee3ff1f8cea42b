"""What the bubblewrap sandbox adds to a child's start-up (issue 16): the same command with and without it.

Three children, each started `--repeats` times, interleaved (plain, sandboxed, plain, …) so machine
noise hits both alike: `/usr/bin/true` (bwrap's own cost), `python -c pass`, and `python -c "import
torch"` (what every model check and job process pays first). Prints the medians and the difference.
`PYTHONPATH=$PWD python bench/sandbox_overhead.py [--repeats 10]`
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from job_host import bubblewrap, sandbox

CHILDREN = {
    "true": ["/usr/bin/true"],
    "python": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
}


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    return f"{model}; " + " ".join(f for f in flags if f.startswith(("avx", "amx", "sse4", "fma")))


def once(argv: list[str], folder: Path, sandboxed: bool, bwrap: str) -> float:
    command = bubblewrap.wrap(argv, folder, bwrap=bwrap) if sandboxed else bubblewrap.Command(argv)
    start = time.perf_counter()
    try:
        subprocess.run(command.argv, cwd=folder, env=sandbox.child_env(), pass_fds=command.pass_fds, check=True)
    finally:
        command.close_fds()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    state = bubblewrap.require()
    if state.mode != "bubblewrap":
        sys.exit(f"no sandbox to measure: {state.detail}")
    print(f"cpu: {cpu_flags()}\nbwrap: {state.bwrap}, seccomp {'on' if state.seccomp else 'off'}")
    print(f"{'child':<14}{'plain ms':>10}{'sandboxed ms':>14}{'added ms':>10}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, argv in CHILDREN.items():
            samples: dict[bool, list[float]] = {False: [], True: []}
            once(argv, folder, True, state.bwrap)  # warm the page cache for both
            for _ in range(args.repeats):
                for sandboxed in (False, True):
                    samples[sandboxed].append(once(argv, folder, sandboxed, state.bwrap))
            plain, boxed = (statistics.median(samples[k]) * 1000 for k in (False, True))
            print(f"{name:<14}{plain:>10.1f}{boxed:>14.1f}{boxed - plain:>10.1f}{boxed / plain:>8.2f}")


if __name__ == "__main__":
    main()
