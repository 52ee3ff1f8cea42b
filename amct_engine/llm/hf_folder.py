"""A Hugging Face model folder (config.json + safetensors, or a GGUF file; tokenizer files alongside), checked
and built with transformers' own architectures only (docs/spec/llm.md §8).

Two halves:
- torch-free checks on names and on config.json's JSON (``check_folder_files``, ``check_model_config``): the
  API runs them on a zip's listing before anything unpacks it, and ``load_folder`` runs them again on the
  unpacked folder. ``FolderError.file`` names the file at fault;
- ``load_folder``: the causal LM and its tokenizer, built inside the job sandbox. ``trust_remote_code`` is never
  set and the weights are read only from safetensors or GGUF, so no code of the folder's runs and nothing is
  unpickled: a folder whose config asks for its own code (``auto_map``) or names an architecture transformers
  does not ship is refused, as is any pickle-format file (``PICKLE_SUFFIXES``), whatever its name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# The formats torch.load / pickle read (transformers' pytorch_model.bin, Lightning's .ckpt, …): code, not data.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
WEIGHT_SUFFIXES = (".safetensors", ".gguf")
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
# JSON files whose `auto_map` makes transformers import a module shipped in the folder.
REMOTE_CODE_FILES = (CONFIG_FILE, "tokenizer_config.json", "processor_config.json", "generation_config.json")
MAX_JSON_BYTES = 4 << 20  # a config.json is a few KiB; a tokenizer_config with a chat template tens


class FolderError(ValueError):
    """A folder that is not a safe, loadable model folder; ``file`` names the file at fault (its path in the
    folder or zip), ``field`` the config key when there is one."""

    def __init__(self, message: str, file: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.file, self.field = file, field


def folder_root(names: Iterable[str]) -> str:
    """The prefix the folder's files share in a zip: '' when config.json (or the GGUF file) is at the top, else
    the one top-level folder holding it (`zip -r model.zip model/`)."""
    names = [n for n in names if not n.endswith("/")]
    markers = [n for n in names if n.rpartition("/")[2] == CONFIG_FILE or n.endswith(".gguf")]
    depths = sorted(markers, key=lambda n: n.count("/"))
    if not depths:
        return ""
    top = depths[0].rpartition("/")[0]
    return top + "/" if top else ""


def is_model_folder(names: Iterable[str]) -> bool:
    """A zip listing that is a Hugging Face folder (a config.json or a GGUF file), not a TorchScript archive
    (whose data.pkl is refused here anyway: the TorchScript check takes those)."""
    names = list(names)
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return False
    return any(n.rpartition("/")[2] == CONFIG_FILE or n.endswith(".gguf") for n in names)


def check_folder_files(names: Iterable[str]) -> list[str]:
    """The folder's weight files (relative names); FolderError naming a pickle-format file, or saying that no
    safetensors / GGUF weights are there."""
    names = [n for n in names if not n.endswith("/")]
    for name in names:
        if name.lower().endswith(PICKLE_SUFFIXES):
            raise FolderError(
                f"{name} is a pickle-format file (torch.save / pickle): it can run code when loaded, and this "
                "service reads weights from safetensors or GGUF only; convert it (save_pretrained with "
                "safe_serialization=True) and leave it out of the zip",
                file=name,
            )
    weights = [n for n in names if n.lower().endswith(WEIGHT_SUFFIXES)]
    if not weights:
        raise FolderError(
            "the folder has no weights: it needs *.safetensors files next to config.json, or a .gguf file",
            file=CONFIG_FILE,
        )
    if not any(n.endswith(".gguf") for n in weights) and not any(n.rpartition("/")[2] == CONFIG_FILE for n in names):
        raise FolderError("the folder has safetensors weights but no config.json", file=CONFIG_FILE)
    return weights


def read_json(data: bytes, file: str) -> dict[str, Any]:
    if len(data) > MAX_JSON_BYTES:
        raise FolderError(f"{file} is {len(data)} bytes; the limit is {MAX_JSON_BYTES}", file=file)
    try:
        value = json.loads(data)
    except ValueError as e:
        raise FolderError(f"{file} is not valid JSON ({e})", file=file) from None
    if not isinstance(value, dict):
        raise FolderError(f"{file} must hold a JSON object", file=file)
    return value


def known_model_types() -> Mapping[str, str]:
    """model_type -> config class name, for every architecture transformers ships. Read from transformers'
    table module, which imports neither torch nor any model code (the API calls this); older releases keep the
    table in configuration_auto, which does."""
    try:
        from transformers.models.auto.auto_mappings import CONFIG_MAPPING_NAMES
    except ImportError:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return CONFIG_MAPPING_NAMES


def check_remote_code(config: Mapping[str, Any], file: str) -> None:
    """FolderError when the JSON asks transformers to import the folder's own code."""
    if "auto_map" in config:
        raise FolderError(
            f"{file} has an auto_map: it asks for the folder's own Python code (trust_remote_code), which this "
            "service never runs; use a model of one of transformers' architectures",
            file=file,
            field="auto_map",
        )


def check_model_config(config: Mapping[str, Any], known: Mapping[str, str] | None = None) -> str:
    """config.json's model_type, once it is one transformers knows and nothing asks for remote code."""
    check_remote_code(config, CONFIG_FILE)
    model_type = config.get("model_type")
    known = known_model_types() if known is None else known
    if not isinstance(model_type, str) or model_type not in known:
        raise FolderError(
            f"config.json's model_type {model_type!r} is not an architecture transformers ships; this service "
            "builds only those (never a folder's own code)",
            file=CONFIG_FILE,
            field="model_type",
        )
    return model_type


def _check_unpacked(folder: Path) -> list[str]:
    names = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink()]
    for p in folder.rglob("*"):
        if p.is_symlink():  # the zip check refuses none, but an unpacked folder is checked as it is
            raise FolderError(f"{p.relative_to(folder)} is a symbolic link", file=str(p.relative_to(folder)))
    weights = check_folder_files(names)
    for file in REMOTE_CODE_FILES:
        if (folder / file).is_file():
            config = read_json((folder / file).read_bytes(), file)
            if file == CONFIG_FILE:
                check_model_config(config)
            else:
                check_remote_code(config, file)
    return weights


def load_folder(folder: str | os.PathLike) -> tuple[Any, Any]:
    """(the causal LM in float32, eval mode; its tokenizer) from an unpacked folder, checked first.

    safetensors: ``AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)``; GGUF (no safetensors):
    ``from_pretrained(folder, gguf_file=...)`` (needs the ``gguf`` package). The tokenizer: tokenizer.json read by
    the ``tokenizers`` library itself (a JSON file, no code), wrapped as a transformers fast tokenizer; else the
    GGUF file's vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    weights = _check_unpacked(folder)
    gguf = sorted(w for w in weights if w.endswith(".gguf"))
    common = {"dtype": torch.float32, "trust_remote_code": False, "local_files_only": True}
    if any(w.endswith(".safetensors") for w in weights):
        model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, **common)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf[0], **common)
    if (folder / TOKENIZER_FILE).is_file():
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / TOKENIZER_FILE))
    elif gguf:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf[0], trust_remote_code=False)
    else:
        raise FolderError("the folder has no tokenizer.json (nor a GGUF file with a vocabulary)", file=TOKENIZER_FILE)
    return model.eval(), tokenizer
