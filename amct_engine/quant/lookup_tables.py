"""Embedding tables rounded to int8 rows in the quantised PyTorch model (docs/spec/engine.md §5, "Embedding
tables as int8 rows").

The deploy file stores a large lookup table as int8 codes with one scale per row (export/qdq/embeddings.py).
So that the PyTorch model a user calibrates, trains, distils and evaluates computes what the deploy file
computes, every quantising API rounds such a table in place when it builds its model, to the same codes and
scales, and freezes it: a trained table would leave the grid, and the export would then round it again
behind the learned quantisers (the distilled MiniLM's deploy file fell from 0.99987 to 0.99318 cosine to its
PyTorch model when only the export rounded). The export writes a table as int8 rows only where it lies on
that grid, so a table the PyTorch side did not round stays float.

A lookup table: a float matrix of at least MIN_TABLE_BYTES that the captured graph reads only as the weight of
embedding lookups (nn.Embedding, F.embedding, aten.embedding) and that no other module holds (a tied
language-model head keeps the table float, as the export does).
"""

from __future__ import annotations

import torch
from torch import fx, nn

from amct_engine.graph.capture import CapturedModel

MIN_TABLE_BYTES = 1 << 20  # smaller tables (position, token-type embeddings) save too little to be worth the ops
_LOOKUPS = {torch.nn.functional.embedding, torch.embedding, torch.ops.aten.embedding.default}


def per_row_int8(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, float32 scales [rows, 1]): symmetric, one scale per row, max|row| / 127 (1 for a zero row)."""
    table = table.detach().float()
    scales = table.abs().amax(dim=1, keepdim=True) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return torch.clamp(torch.round(table / scales), -127, 127).to(torch.int8), scales


def round_lookup_tables(cm: CapturedModel) -> list[str]:
    """Round every lookup table of `cm.module` to its int8 rows (in place, `requires_grad` off); their names."""
    tables = _lookup_tables(cm)
    for table in tables.values():
        codes, scales = per_row_int8(table)
        with torch.no_grad():
            table.copy_(codes.float() * scales)
        table.requires_grad_(False)
    return sorted(tables)


def _lookup_tables(cm: CapturedModel) -> dict[str, nn.Parameter]:
    holders: dict[int, int] = {}
    for _, parameter in cm.module.named_parameters(remove_duplicate=False):
        holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    found: dict[str, nn.Parameter] = {}
    other_uses: set[int] = set()
    for node in cm.graph.nodes:
        if node.op == "call_module" and isinstance(cm.get_module(node.target), nn.Embedding):
            found[f"{node.target}.weight"] = cm.get_module(node.target).weight
        elif node.op == "get_attr":
            parameter = _attribute(cm.graph_module, node.target)
            if isinstance(parameter, nn.Parameter):
                if all(_reads_as_table(user, node) for user in node.users):
                    found[node.target] = parameter
                else:
                    other_uses.add(id(parameter))
    return {
        name: p
        for name, p in found.items()
        if p.dim() == 2
        and p.dtype == torch.float32
        and p.numel() * 4 >= MIN_TABLE_BYTES
        and holders.get(id(p), 0) <= 1
        and id(p) not in other_uses
    }


def _reads_as_table(user: fx.Node, weight: fx.Node) -> bool:
    return user.op == "call_function" and user.target in _LOOKUPS and user.args[0] is weight


def _attribute(module: nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part, None)
    return module
