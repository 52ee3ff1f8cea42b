"""The files of the compose smoke test's job (scripts/compose_smoke.sh), written inside the api container:
a small TorchScript CNN, an INT8 QAT cfg and 128 labelled 1x8x8 samples, in the folder given as argv[1]."""

import sys
from pathlib import Path

import numpy as np
import torch

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 4, 3, padding=1),
    torch.nn.BatchNorm2d(4),
    torch.nn.ReLU(),
    torch.nn.Flatten(),
    torch.nn.Linear(4 * 8 * 8, 3),
).eval()
torch.jit.save(torch.jit.trace(model, torch.zeros(1, 1, 8, 8)), out / "model.pt")
(out / "quant.cfg").write_text(
    "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"
    "retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n"
)
rng = np.random.default_rng(0)
np.savez(
    out / "data.npz",
    inputs=rng.standard_normal((128, 1, 8, 8)).astype(np.float32),
    labels=rng.integers(0, 3, 128).astype(np.int64),
)
print(out)
