"""Pruning (docs/spec/engine.md §4.4, §4.5): channel dependency groups, BCP filter pruning, 4-of-2 selective sparsity.

Every pruning decision asks one structure, the channel dependency graph (``dependency.py`` builds
it from the captured fx graph, ``channel_groups.py`` holds it): which layers must lose the same
channels. What each layer type does with channels, and how to remove them, is one table,
``layer_pruners.LAYER_PRUNERS`` (``register_layer_pruner`` adds a user layer type); the ops without
per-channel parameters are ``op_vocabulary.py``'s. ``settings.py`` reads what the cfg asks of each
layer, an importance criterion (``importance.py``; ``bcp.py``, the default) ranks a group's
channels, ``apply.py`` removes them physically (and bisects away groups that break the forward),
``selective.py`` keeps 2 of every 4 weights along Cin, ``records.py`` writes and replays both in
the record file, ``report.py`` says what happened and why, and ``passes.py`` strings them together
for ``amct_engine.prune_retrain``.

The names below load on first use (PEP 562), so ``import amct_engine.prune.settings`` stays torch-free.
"""

from __future__ import annotations

from amct_engine.registry import lazy_exports

# Public name -> the module that defines it.
_EXPORTS = {
    "LAYER_PRUNERS": "amct_engine.prune.layer_pruners",
    "LayerPruner": "amct_engine.prune.layer_pruners",
    "register_layer_pruner": "amct_engine.prune.layer_pruners",
    "unregister_layer_pruner": "amct_engine.prune.layer_pruners",
    "IMPORTANCE_CRITERIA": "amct_engine.prune.importance",
}
__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
