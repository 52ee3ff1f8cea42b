"""Pruning (spec §4.4, §4.5): channel dependency groups, BCP filter pruning, 4-of-2 selective sparsity.

Every pruning decision asks one structure, the channel dependency graph (``dependency.py`` builds
it from the captured fx graph, ``channel_groups.py`` holds it): which layers must lose the same
channels. ``settings.py`` reads what the cfg asks of each layer, ``bcp.py`` picks the channels of a
group, ``apply.py`` removes them physically (and bisects away groups that break the forward),
``selective.py`` keeps 2 of every 4 weights along Cin, ``records.py`` writes and replays both in
the record file, ``report.py`` says what happened and why, and ``passes.py`` strings them together
for ``amct_engine.prune_retrain``.
"""
