"""`make samples`: files for the service walk-through (docs/service.md) made from real data.

Writes into --out (default `samples/`): `cnn.pt` (a TorchScript SmallFashionCnn trained for one
epoch on Fashion-MNIST), `quant.cfg` (INT8 QAT), `compress.cfg` (30 % filter pruning + INT8),
`distill.cfg` and `fmnist.npz` (`inputs` float32 [N,1,28,28], `labels` int64, images the model
never saw).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from examples.fashion_mnist import fashion_mnist_available, load_fashion_mnist
from examples.models import SmallFashionCnn
from job_process.training import make_loader, train_epochs

CONFIGS = {
    "quant.cfg": "retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n"
    "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n",
    "compress.cfg": "prune_config { filter_pruner { balanced_l2_norm_filter_prune {\n"
    "  prune_ratio: 0.3\n  ascend_optimized: false\n} } }\n"
    "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n",
    "distill.cfg": "batch_num: 1\ngroup_size: 1\n",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="samples")
    parser.add_argument("--dataset-size", type=int, default=2000)
    args = parser.parse_args(argv)
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
    model = SmallFashionCnn()
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


if __name__ == "__main__":
    sys.exit(main())
