"""Hugging Face model folders uploaded as a zip (the llm_quant kind's models): looked at before anything unpacks
them, then built in a sandboxed child.

At upload, with no code run and nothing unpacked: the zip checks every upload gets (service/zipcheck.py: entry
count, unpacked size, paths, compression ratio), then the folder's files (no pickle-format file, safetensors or
GGUF weights) and its config.json (no `auto_map`, a model_type transformers ships), read from the archive
(amct_engine/llm/hf_folder.py). A refusal is a 422 whose `file` member names the file at fault. What passes is
built with transformers' own architecture and run once on a few tokens in the sandbox
(job_process/validate_llm.py), as every user model is.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass

from core.settings import Settings
from service.problems import Problem
from service.zipcheck import check_zip

# The signature of a causal LM as the job kinds see it: token ids in, prefill logits out.
LLM_INPUTS = [{"name": "input_ids", "shape": ["batch", "sequence"], "dtype": "int64"}]
LLM_EXAMPLE_SHAPE = [1, 8]
FORMAT = "hf_folder"  # the models.format of such an upload ("torchscript" for the others)


@dataclass(frozen=True)
class ModelFolder:
    root: str  # the prefix of the folder's files in the zip ('' or 'name/')
    weights: list[str]
    model_type: str | None  # None: a GGUF file without config.json (its own metadata names the architecture)


def _refuse(error, root: str = "") -> Problem:
    """The 422 for a FolderError: `file` names the file as the zip holds it."""
    file = root + error.file if error.file else None
    extra = {"file": file} if file else {}
    if error.field:
        extra["config_field"] = error.field
    return Problem(422, f"the model folder is refused: {error}", field="file", **extra)


def inspect_upload(path: str, settings: Settings) -> ModelFolder | None:
    """The folder an uploaded zip holds, checked; None when the file is not a model folder (a TorchScript
    archive, or anything else: the TorchScript check speaks for those)."""
    from amct_engine.llm.hf_folder import (
        CONFIG_FILE,
        MAX_JSON_BYTES,
        REMOTE_CODE_FILES,
        FolderError,
        check_folder_files,
        check_model_config,
        check_remote_code,
        folder_root,
        is_model_folder,
        read_json,
    )

    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as zf:
        names = [i.filename for i in zf.infolist()]
    if not is_model_folder(names):
        return None
    try:
        infos = check_zip(path, settings.max_zip_entries, settings.max_unpacked_bytes, "the model zip")
    except ValueError as e:
        raise Problem(422, str(e), field="file") from None
    root = folder_root(names)
    outside = [i.filename for i in infos if not i.filename.startswith(root)]
    if outside:
        raise Problem(
            422,
            f"the model zip holds {outside[0]!r} outside the model's folder {root!r}: zip one folder",
            field="file",
            file=outside[0],
        )
    relative = [i.filename[len(root) :] for i in infos]
    model_type = None
    try:
        weights = check_folder_files(relative)
        with zipfile.ZipFile(path) as zf:
            for file in REMOTE_CODE_FILES:
                if file not in relative:
                    continue
                info = zf.getinfo(root + file)
                if info.file_size > MAX_JSON_BYTES:  # refused before it is read
                    raise FolderError(f"{file} is {info.file_size} bytes; the limit is {MAX_JSON_BYTES}", file=file)
                config = read_json(zf.read(info), file)
                if file == CONFIG_FILE:
                    model_type = check_model_config(config)
                else:
                    check_remote_code(config, file)
    except FolderError as e:
        raise _refuse(e, root) from None
    return ModelFolder(root, weights, model_type)
