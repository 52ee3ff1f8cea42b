"""The torch layer classes the engine's passes name, defined once (capture, pruning, export).

Which of them can be pruned, and how, is the layer-pruner table's business (amct_engine/prune);
which can be quantised is docs/spec/engine.md §4.9's table. These tuples only group the classes.
"""

from __future__ import annotations

from torch import nn

CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
CONV_TRANSPOSE_TYPES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
