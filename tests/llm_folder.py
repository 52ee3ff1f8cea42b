"""A tiny Hugging Face causal-LM folder for the llm_quant tests, built offline.

The tokenizer: a byte-level BPE trained with the `tokenizers` library on Python's pydoc topics (a real
vocabulary, no download); the model: a random-init LlamaForCausalLM (hidden 64, 2 layers) over it, saved with
`save_pretrained` (config.json + model.safetensors) next to tokenizer.json. Text for the jobs: other pydoc
topics than the tokenizer's.
"""

from __future__ import annotations

import io
import json
import pydoc_data.topics
import zipfile
from pathlib import Path

VOCAB = 512


def topics_text(start: int, stop: int) -> str:
    keys = sorted(pydoc_data.topics.topics)
    return "\n\n".join(pydoc_data.topics.topics[k] for k in keys[start:stop])


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    tokenizer.train_from_iterator([topics_text(0, 40)], trainer=trainer)
    return tokenizer


def tiny_llama(vocab: int, seed: int = 0):
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # outlier input channels, as trained LLMs have (tests/test_llm_quant.py)
        for layer in model.model.layers:
            layer.input_layernorm.weight[:3] = 8.0
            layer.post_attention_layernorm.weight[5:7] = 6.0
    return model


def write_folder(folder: Path, seed: int = 0) -> Path:
    """config.json, model.safetensors, tokenizer.json in `folder`."""
    tokenizer = train_tokenizer()
    model = tiny_llama(tokenizer.get_vocab_size(), seed)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def zip_folder(folder: Path, extra: dict[str, bytes] | None = None, config_update: dict | None = None) -> bytes:
    """The folder as a zip (its files at the top), with `extra` files added and config.json's keys updated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.iterdir()):
            data = path.read_bytes()
            if path.name == "config.json" and config_update:
                data = json.dumps({**json.loads(data), **config_update}).encode()
            zf.writestr(path.name, data)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()
