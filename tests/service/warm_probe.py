"""A stand-in warm job process (tests/service/test_warm_start.py): what does it see before and after its job?

`python -m tests.service.warm_probe DIR --warm`, started by worker/warm.py's pool in the real sandbox. Before
its job it lists its folder, the folder above it (the worker's scratch folder on the host, which holds
other jobs' folders) and another job's folder there; then it says it is ready, waits for its job, lists
again, reads the spec, and reports all of it as result.json's `metrics`.
"""

import json
import os
import sys
from pathlib import Path

from job_host.protocol import READY_LINE, RESULT_FILE, STARTED_LINE
from job_host.sandbox import limit_self
from job_process.warm import wait_for_start


def listing(path: Path) -> list[str] | str:
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        return f"{type(e).__name__}: errno {e.errno}"


def main(argv: list[str]) -> int:
    limit_self()
    print(STARTED_LINE, flush=True)
    folder = Path(argv[0])
    seen = {
        "cwd": os.getcwd(),
        "folder_before": listing(folder),
        "scratch_before": listing(folder.parent),
        "other_job_before": listing(folder.parent / "job-secret-0000"),
    }
    print(READY_LINE, flush=True)
    if not wait_for_start():
        return 0
    seen.update(
        folder_after=listing(folder),
        scratch_after=listing(folder.parent),
        spec=json.loads((folder / "spec.json").read_text()),
    )
    (folder / RESULT_FILE).write_text(
        json.dumps(
            {
                "metrics": seen,
                "artifacts": [{"kind": "probe", "path": str(folder / "spec.json"), "media_type": "application/json"}],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
