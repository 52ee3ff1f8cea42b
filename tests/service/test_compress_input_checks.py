"""`amct compress` refuses the inputs the API refuses (POST /v1/models, /v1/configs, /v1/datasets, /v1/jobs),
with the same checks, before its engine starts: one line on stderr naming the file, exit status 1 (issue 39 item 5).

Before, a text file as the model, a typo in the cfg or a dataset of another shape failed only once the job
process had started, 10-30 s later, a text file as "the model raised RuntimeError …".
"""

from __future__ import annotations

import time
import zipfile

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from service import local_compress
from service.cli import app
from service.zipcheck import check_torchscript
from tests.service.support import QUANT_CFG

runner = CliRunner()
LIMITS = (10_000, 1 << 33)


@pytest.fixture
def no_engine(monkeypatch):
    """The engine must not start: a refusal that came from it would be too late."""

    def started(*args, **kwargs):
        raise AssertionError("the engine started")

    monkeypatch.setattr(local_compress, "compress", started)


def refused(*args) -> tuple[str, float]:
    """Run `amct compress …`; the one line it wrote to stderr, and how long it took."""
    start = time.monotonic()
    result = runner.invoke(app, ["compress", *map(str, args)], catch_exceptions=False)
    elapsed = time.monotonic() - start
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0], elapsed


def compress_args(assets, tmp_path, **given) -> list:
    files = {"model": assets / "cnn.pt", "cfg": assets / "quant.cfg", "data": assets / "small.npz", **given}
    return ["--model", files["model"], "--cfg", files["cfg"], "--data", files["data"], "--out", tmp_path / "out"]


# -- the model --------------------------------------------------------------------------------------------


def test_a_text_file_as_the_model_is_refused_at_once(assets, tmp_path, no_engine):
    model = tmp_path / "model.txt"
    model.write_text("not a model\n")
    line, elapsed = refused(*compress_args(assets, tmp_path, model=model))
    assert f"bad_model: {model} is not a zip archive; --model takes a TorchScript file (torch.jit.save)" in line
    assert "the model raised" not in line
    assert elapsed < 5, elapsed  # the engine took 8-28 s to say so
    assert not (tmp_path / "out").exists()


def test_a_torch_save_checkpoint_as_the_model_is_refused_naming_what_it_lacks(assets, tmp_path, no_engine):
    model = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), model)
    line, _ = refused(*compress_args(assets, tmp_path, model=model))
    assert f"{model} is a zip archive but not a TorchScript file: it has no constants.pkl" in line
    assert not (tmp_path / "out").exists()


def test_the_torchscript_check_passes_scripted_and_traced_models_and_refuses_other_zips(tmp_path):
    linear = torch.nn.Linear(2, 2)
    torch.jit.script(linear).save(str(tmp_path / "scripted.pt"))
    torch.jit.trace(linear, torch.zeros(1, 2)).save(str(tmp_path / "traced.pt"))
    for name in ("scripted.pt", "traced.pt"):
        assert check_torchscript(str(tmp_path / name), *LIMITS, name)

    np.savez(tmp_path / "arrays.npz", inputs=np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="arrays.npz is a zip archive but not a TorchScript file: it has no data.pkl"):
        check_torchscript(str(tmp_path / "arrays.npz"), *LIMITS, "arrays.npz")
    zipfile.ZipFile(tmp_path / "empty.zip", "w").close()
    with pytest.raises(ValueError, match="empty.zip is an empty zip archive"):
        check_torchscript(str(tmp_path / "empty.zip"), *LIMITS, "empty.zip")
    # An end record that looks right in front of a broken directory: a ValueError (a 422), not BadZipFile (a 500).
    (tmp_path / "broken.pt").write_bytes(b"garbage" + (tmp_path / "scripted.pt").read_bytes()[-200:])
    with pytest.raises(ValueError, match="broken.pt is not a readable zip archive"):
        check_torchscript(str(tmp_path / "broken.pt"), *LIMITS, "broken.pt")


# -- the cfg ----------------------------------------------------------------------------------------------


def test_a_typo_in_the_cfg_is_refused_naming_the_field_and_its_line(assets, tmp_path, no_engine):
    cfg = tmp_path / "typo.cfg"
    text = QUANT_CFG.decode()
    assert text.splitlines()[2].startswith("retrain_data_quant_config { ulq_quantize { dst_type")
    cfg.write_text(text.replace("ulq_quantize { dst_type", "ulq_quantize { dts_type"))
    line, elapsed = refused(*compress_args(assets, tmp_path, cfg=cfg))
    assert f'bad_cfg: {cfg}:3:44: unknown field "dts_type"' in line and '(did you mean "dst_type"?)' in line
    assert elapsed < 5, elapsed
    assert not (tmp_path / "out").exists()


def test_a_cfg_that_does_not_suit_the_kind_is_refused_naming_its_line(assets, tmp_path, no_engine):
    # The quant cfg parses, but a prune job's cfg must prune and not quantize (POST /v1/jobs: config_id).
    line, _ = refused(*compress_args(assets, tmp_path), "--kind", "prune_retrain")
    assert (
        f"bad_cfg: --cfg does not suit prune_retrain: {assets / 'quant.cfg'}:2:1:" in line
        and "(--kind prune_retrain)" in line
    )
    assert "not allowed in a prune config" in line


# -- the dataset and the settings ---------------------------------------------------------------------------


def test_a_dataset_that_does_not_fit_the_declared_input_shape_is_refused_naming_the_mismatch(
    assets, tmp_path, no_engine
):
    data = tmp_path / "rgb.npz"
    np.savez(data, inputs=np.zeros((8, 3, 32, 32), np.float32), labels=np.zeros(8, np.int64))
    line, elapsed = refused(*compress_args(assets, tmp_path, data=data), "--input-shape", "1,1,28,28")
    assert f"bad_dataset: {data} does not suit the model" in line
    assert "array 'inputs' has per-sample shape [3, 32, 32] but input 'input' is [1, 28, 28] (--data)" in line
    assert elapsed < 5, elapsed
    assert not (tmp_path / "out").exists()


def test_a_bad_job_setting_is_still_refused_first(assets, tmp_path, no_engine):
    line, _ = refused(*compress_args(assets, tmp_path), "--epochs", 0)
    assert "--epochs 0: Input should be greater than or equal to 1" in line


def test_valid_inputs_reach_the_engine(assets, tmp_path, monkeypatch):
    """The checks pass a real model, cfg and dataset: the engine is called, with the objective they resolved."""
    calls = []

    def engine(model, cfg, data, kind, out, signature, shape, params, device, on_message):
        calls.append((kind, params.objective))
        return {"metrics": {}, "report": {}, "files": {}}

    monkeypatch.setattr(local_compress, "compress", engine)
    monkeypatch.setattr("service.cli._print_result", lambda result, title: None)
    result = runner.invoke(app, ["compress", *map(str, compress_args(assets, tmp_path))], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert calls == [("compressed_retrain", "cross_entropy")]
