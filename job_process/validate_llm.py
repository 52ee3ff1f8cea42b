"""Child process: is the upload a Hugging Face causal-LM folder (a zip) the llm_quant kind can work on?

Unpacks the zip into its own folder, builds the model with transformers' own architecture and its tokenizer
(amct_engine/llm/hf_folder.py `load_folder`: no remote code, no pickle), runs one forward on a few tokens of
text, then prints one JSON line as job_process/validate_model.py does: `{"ok": true, "parameters", "outputs",
"output_shapes", "layers"}` or `{"ok": false, "stage", "error"}`.
Run as `python -m job_process.validate_llm ZIP`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from job_host.errors import describe
from job_host.sandbox import limit_self

PROBE_TEXT = "The quick brown fox jumps over the lazy dog."


def unpack(zip_path: str, into: Path) -> Path:
    """The zip's model folder, unpacked under `into` (the upload was checked: service/model_folder.py); the
    folder itself (the one that holds config.json or the GGUF file)."""
    import zipfile

    from amct_engine.llm.hf_folder import folder_root

    with zipfile.ZipFile(zip_path) as zf:
        root = folder_root(i.filename for i in zf.infolist())
        zf.extractall(into)  # zipfile drops absolute parts and `..` from names
    return into / root if root else into


def validate(zip_path: str, workdir: Path) -> dict:
    import torch

    from amct_engine.llm.hf_folder import FolderError, load_folder

    stage = "folder"  # building it is the folder's check (service/routes/models.py's "load as a … folder")
    try:
        model, tokenizer = load_folder(unpack(zip_path, workdir / "model"))
        stage = "forward"
        ids = torch.tensor([tokenizer(PROBE_TEXT)["input_ids"][:8] or [0]])
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits
        if not torch.isfinite(logits).all():
            raise ValueError("the model's logits on a few tokens of text are not finite")
    except FolderError as e:
        return {"ok": False, "stage": "folder", "error": str(e), "file": e.file}
    except Exception as e:
        return {"ok": False, "stage": stage, "error": describe(e, stage)}
    linears = [
        {"name": name, "type": type(m).__name__}
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name
    ]
    shape = list(logits.shape)
    return {
        "ok": True,
        "parameters": sum(p.numel() for p in model.parameters()),
        "outputs": {"type": "tensor", "shape": ["batch", "sequence", shape[-1]], "dtype": "float32"},
        "output_shapes": [shape],
        "layers": {
            "quantizable": linears,
            "model_type": model.config.model_type,
            "architecture": type(model).__name__,
            "vocab_size": int(model.config.vocab_size),
        },
    }


def main(argv: list[str]) -> int:
    limit_self()
    print(json.dumps(validate(argv[0], Path.cwd())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
