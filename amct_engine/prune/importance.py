"""Importance criteria: how the channels of a group are ranked for filter pruning (docs/spec/engine.md §4.4 step 3).

A criterion is a callable ``(group, model) -> scores``: one score per channel of the ``ChannelGroup``
(a 1-D tensor of ``group.size``), computed from the group's layers in ``model``; the lowest scores
are pruned first. How many go, and the equal share of each grouped-conv part, are the spec's count
rules (``bcp.remain_count`` / ``bcp.select_pruned_channels``), the same for every criterion.
``passes.filter_prune`` takes the criterion; ``IMPORTANCE_CRITERIA`` names them, "bcp" the default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from amct_engine.prune.bcp import bcp_importance
from amct_engine.prune.channel_groups import ChannelGroup
from amct_engine.registry import Registry

ImportanceCriterion = Callable[[ChannelGroup, nn.Module], torch.Tensor]

IMPORTANCE_CRITERIA: Registry[ImportanceCriterion] = Registry("pruning importance criterion")
DEFAULT_IMPORTANCE = "bcp"

# docs/spec/engine.md §4.4 step 3: balanced L2-norm filter scores, averaged over the group's producers
IMPORTANCE_CRITERIA.register("bcp", bcp_importance)
