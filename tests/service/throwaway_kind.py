"""A job kind that exists only for test_extension_points.py: it deploys the model unchanged.

Importing this module registers the kind. The test process imports it itself; the job process
imports it because the test names it in AMCT_JOB_KIND_MODULES, which job_host/kinds.py reads and
the sandbox passes on (the mechanism a plugin kind uses).
"""

from __future__ import annotations

import shutil

from job_host.kinds import JobKind, register_job_kind
from job_host.protocol import emit

KIND = JobKind(
    "throwaway",
    "retrain",
    None,
    False,
    "a test kind: the deploy model is the FP32 model",
    "tests.service.throwaway_kind:run",
)
RAN = "the throwaway runner ran"
register_job_kind(KIND, replace=True)


def run(ctx):
    import torch

    emit("log", level="info", message=RAN)
    ctx.phase("exporting_onnx")
    # job_process/main.py exported the FP32 model before calling the runner: deploy that.
    shutil.copyfile(ctx.path("fp32.onnx"), ctx.path("deploy.onnx"))
    ctx.files["deploy"] = ctx.path("deploy.onnx")
    return torch.jit.load(ctx.model_path, map_location="cpu").eval()
