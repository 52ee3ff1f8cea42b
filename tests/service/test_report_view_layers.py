"""The CLI's per-layer tables of the search kinds (service/report_view.py layer_tables)."""

from __future__ import annotations

from rich.console import Console

from service.report_view import layer_tables


def _text(report: dict) -> str:
    console = Console(width=200, record=True)
    for table in layer_tables(report):
        console.print(table)
    return console.export_text()


def test_sensitivity_and_mixed_precision_rows():
    row = {"layer": "fc", "variant": "INT4", "top1_drop": 4.0, "cosine": 0.9, "macs_share": 0.044, "bytes_share": 0.767}
    text = _text(
        {
            "sensitivity": {"rows": [row, {**row, "layer": "conv1", "top1_drop": None, "cosine": 0.99}]},
            "mixed_precision": {
                "budget": {"max_top1_drop": 0.5},
                "deployed": {"top1_drop": 0.3},
                "weight_bytes": 10216,
                "int8_weight_bytes": 20432,
                "precisions": {"conv1": "INT4", "fc": "INT8"},
            },
        }
    )
    assert "│ fc    │ INT4    │ 4.00 pts      │ 4.4% │ 76.7%   │" in text
    assert "cosine 0.9900" in text
    assert "mixed precision (max_top1_drop 0.5): deploy 0.30 pts, weights 10.0 KiB vs 20.0 KiB all-INT8" in text
    assert "│ conv1 │ INT4      │" in text
    assert layer_tables({"onnx_size_bytes": {}}) == []
