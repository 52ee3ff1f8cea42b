"""The job process started ahead of its job (`python -m job_process.main DIR --warm`): the child's side.

Most of a small job's time is the child's start-up, not its work: importing torch and the engine,
then the first graph capture, which imports torch.export and torch._dynamo (measured on the 2-core
development machine: 2.7 s of imports, then 3.7 s for the first `create_quant_retrain_config` of a
2.6k-parameter TorchScript model and 0.25 s for the second, same process). A worker therefore keeps
one child started ahead (worker/warm.py): it pays those costs here, on a model of its own in its
private /tmp, before any job exists, then waits on stdin for the one line that says its job's files
are in its folder. It still runs exactly one job and exits, in the same sandbox a cold child gets
(job_host/bubblewrap.py): the folder it was started with was empty, and becomes the job folder
only when the worker hands the job over (docs/security.md, "Warm job processes").

Nothing of the warm-up reaches the job: its model and files live on the sandbox's tmpfs, torch's
global RNG is re-seeded by the job (job_process/main.py), and the warm-up runs inside
`warnings.catch_warnings()`, whose exit resets the warnings registries, so a warning the job raises
is shown even when the warm-up raised the same one.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

from job_host.protocol import START_LINE

_CFG = "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"


def warm_up() -> None:
    """Import what every job imports and run the engine's capture, QAT and export path once on a tiny model.

    Each step pays a one-time cost a job would otherwise pay: module imports, torch.export's and the
    ONNX exporter's first use, onnxruntime's first session.
    """
    import torch
    from torch import nn

    import amct_engine as amct
    from amct_engine.export.save import export_onnx
    from job_host.kinds import JOB_KINDS
    from job_process import report  # noqa: F401 - onnx and onnxruntime, imported by every job's report

    for kind in JOB_KINDS.names():  # the runners and what they import (search kinds included)
        JOB_KINDS[kind].load_runner()

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(1, 2, 3, padding=1), nn.Linear(2 * 4 * 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))

    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="warm-") as tmp:
        warnings.simplefilter("ignore")
        folder = Path(tmp)
        model_path, cfg = str(folder / "tiny.pt"), folder / "tiny.cfg"
        torch.jit.script(Tiny().eval()).save(model_path)
        cfg.write_text(_CFG)
        example = (torch.zeros(2, 1, 4, 4),)
        names = {
            "input_names": ["input"],
            "output_names": ["output"],
            "dynamic_axes": {"input": {0: "batch"}, "output": {0: "batch"}},
        }
        export_onnx(torch.jit.load(model_path).eval(), str(folder / "fp32.onnx"), example, **names)
        config, record = str(folder / "quant.json"), str(folder / "record.txt")
        amct.create_quant_retrain_config(config, model_path, example, str(cfg))
        qmodel = amct.create_quant_retrain_model(config, model_path, record, example)
        qmodel(*example).sum().backward()
        qmodel.eval()
        with torch.no_grad():
            qmodel(*example)
        paths = amct.save_quant_retrain_model(config, qmodel, record, str(folder / "model"), example, **names)
        _ort_session(str(paths["deploy"]), example)


def _ort_session(path: str, example) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    session.run(None, {session.get_inputs()[0].name: example[0].numpy()})


def wait_for_start(stream=None) -> bool:
    """Block until the worker hands a job over; False when it closed the pipe instead (it is stopping)."""
    line = (stream or sys.stdin).readline()
    return line.strip() == START_LINE
