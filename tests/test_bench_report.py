"""bench/report.py renders the benchmark report from a fixed results JSON (no benchmark is run or timed)."""

from __future__ import annotations

import pytest

from bench import report


def _row(name: str, family: str, accuracy: float, bytes_ratio: float, b1: float, b64: float, step: float,
         **extra) -> dict:
    latency = {f"latency_b{b}_ratio": {"min": r, "median": r, "max": r} for b, r in ((1, b1), (64, b64))}
    abs_latency = {f"latency_b{b}_s": {"min": r / 1e3, "median": r / 1e3, "max": r / 1e3}
                   for b, r in ((1, b1), (64, b64))}
    return {"name": name, "family": family, "status": "ok", "accuracy": accuracy, "torch_accuracy": accuracy,
            "accuracy_ort_basic": accuracy, "bytes": int(80_000 * bytes_ratio), "bytes_ratio": bytes_ratio,
            "accuracy_delta": accuracy - 0.88, "step_ratio": step, "step_ratio_min": step,
            "step_s": {"min": step / 100, "median": step / 100, "max": step / 100}, "losses": [2.0, 1.0, 0.5],
            "ops": {"Conv": 2}, "deploy_kind": "ONNX", **latency, **abs_latency, **extra}


def results() -> dict:
    rows = [
        _row("FP32", "baseline", 0.88, 1.0, 1.0, 1.0, 1.0),
        _row("amct INT8 QAT", "ours", 0.87, 0.28, 1.5, 1.2, 3.0),
        # beats ours on accuracy and batch-1 latency, loses on size and step time
        _row("NNCF QAT", "peer", 0.875, 0.55, 0.9, 1.19, 4.0),
        {"name": "torchao PT2E QAT (x86)", "family": "peer", "status": "failed", "reason": "RuntimeError: boom"},
    ]
    engine = {"setup": {"model": "SmallFashionCnn", "base_epochs": 1, "base_images": 60000, "batch_size": 128,
                        "base_accuracy": 0.86, "epochs": 2, "train_limit": 60000, "lr": 5e-4, "seed": 0,
                        "test_images": 10000, "threads": 2, "latency_rounds": 20},
              "rows": rows, "total_s": 60.0}
    return {
        "meta": {"command": "make bench", "quick": False, "started": "2026-11-30T10:00:00+00:00", "revision": "abc",
                 "machine": {"cpu": "Test CPU", "cores": 2, "usable_cores": 2, "ram_gib": 8.0, "os": "Debian",
                             "python": "3.11.7", "load_avg_at_start": [0.1, 0.2, 0.3]},
                 "versions": {"torch": "2.13.0"}, "total_s": 600.0},
        "sections": {"engine": {"status": "ok", "wall_s": 60.0, "result": engine},
                     "minilm": {"status": "skipped", "wall_s": 1.0, "reason": "ModuleNotFoundError: x"}},
    }


def test_losses_list_each_metric_a_peer_wins_beyond_noise():
    losses = report.engine_losses(results()["sections"]["engine"]["result"])
    assert {(loss["peer"], loss["metric"]) for loss in losses} == {
        ("NNCF QAT", "top-1"),  # +0.5 pt > 0.2 pt margin
        ("NNCF QAT", "ORT latency b1"),  # 0.9 < 1.5 × 0.9
    }  # b64 (1.19 vs 1.2) is within the 10 % time margin; size and step time are ours
    assert all(loss["ours"] == "amct INT8 QAT" and loss["cause"] for loss in losses)


def test_render_writes_tables_plots_and_the_loss_section(tmp_path):
    pytest.importorskip("matplotlib")
    md = tmp_path / "docs" / "benchmarks.md"
    report.render(results(), md, tmp_path / "docs" / "images")
    text = md.read_text()
    assert "`make bench`" in text and "Test CPU" in text
    assert "| **amct INT8 QAT** | 0.8700 | -1.00 pt | 0.280× |" in text
    assert "failed: RuntimeError: boom" in text and "skipped: ModuleNotFoundError: x" in text
    where = text[text.index("## Where we lose"):]
    assert "NNCF QAT" in where and "ORT latency b1" in where
    for name in ("bench_accuracy_vs_size.png", "bench_latency_vs_size.png", "bench_training_curves.png"):
        png = tmp_path / "docs" / "images" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(images/{name})" in text


def test_profile_table_lists_the_costliest_nodes_with_their_share():
    profile = {"batch": 64, "runs": 30, "total_us": 400.0,
               "nodes": [{"node": "/conv1/Conv_token_1", "op": "QLinearConv", "us": 300.0},
                         {"node": "/fc/MatMulInteger", "op": "MatMulInteger", "us": 100.0}]}
    lines = report.profile_md([{"name": "amct INT8 QAT", "ort_profile": [profile]}, {"name": "FP32"}])
    row = next(line for line in "\n".join(lines).splitlines() if line.startswith("| amct INT8 QAT"))
    assert "| 64 | 400 |" in row and "QLinearConv `conv1/Conv_token_1` 300 (75 %)" in row
    assert report.profile_md([{"name": "FP32"}]) == []


def test_ort_node_profile_times_the_nodes_of_a_real_model(tmp_path):
    import torch

    from bench.common import ort_node_profile

    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(576, 3))
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (torch.randn(1, 1, 14, 14),), str(path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "n"}})
    profile = ort_node_profile(path, batch=8, runs=5)
    ops = {node["op"] for node in profile["nodes"]}
    assert profile["batch"] == 8 and profile["total_us"] > 0
    assert "Conv" in ops or "FusedConv" in ops
    top = sum(node["us"] for node in profile["nodes"])
    assert top > 0 and profile["total_us"] >= top - 1e-6  # the top nodes are part of all nodes (float sums)


def test_deploy_section_renders_the_table_and_lists_where_ours_is_slower():
    rows = [{"model": "FP32", "bytes_ratio": 1.0, "b1_ms": 10.0, "b1_vs_fp32": 1.0},
            {"model": "ORT PTQ QDQ U8S8", "bytes_ratio": 0.25, "b1_ms": 3.0, "b1_vs_fp32": 0.3},
            {"model": "ours", "bytes_ratio": 0.25, "b1_ms": 4.0, "b1_vs_fp32": 0.4}]
    section = {"name": "ResNet-18 layout", "params": 11_689_512, "rows": rows, "notes": {"torchao PT2E": "skipped"},
               "ours_vs_best_peer": {"b1": {"peer": "ORT PTQ QDQ U8S8", "ratio": 4 / 3}},
               "report": {"optimized_op_counts": {"QLinearConv": 20, "QLinearAdd": 8}, "not_fused": {}},
               "profile_ours": {"QLinearConv": 3500.0, "Clip": 300.0}}
    deploy = {"header": {"isa": ["avx2", "avx512_vnni"], "deploy_target(auto)": "x86_vnni",
                         "onnxruntime": "1.32.0", "threads": 2}, "sections": [section]}
    results = {"sections": {"deploy": {"status": "ok", "result": deploy}}}
    text = "\n".join(report.deploy_md(results))
    assert "avx2, avx512_vnni" in text and "| ours | 0.250 | 4.000 | 0.400 |" in text
    assert "20×QLinearConv, 8×QLinearAdd" in text and "layers not fused: none" in text
    assert report.deploy_losses(deploy) == [
        "ResNet-18 layout b1: ours 1.33× ORT PTQ QDQ U8S8; QLinearConv takes 3500 µs of our run"]


def test_deploy_section_leads_with_ratios_of_minima_and_says_the_load():
    def row(model, ms, med):
        return {"model": model, "bytes_ratio": 0.25, "b64_min_ms": ms, "b64_med_ms": med,
                "b64_vs_fp32_min": ms / 10.0, "b64_vs_fp32_med": med / 30.0}
    section = {"name": "CREPE tiny", "params": 486_552, "notes": {},
               "rows": [row("FP32", 10.0, 30.0), row("ORT PTQ QDQ U8S8", 13.0, 20.0), row("ours", 12.0, 25.0)],
               "ours_vs_best_peer": {"b64": {"peer": "ORT PTQ QDQ U8S8", "ratio": 12 / 13, "ratio_median": 1.25,
                                                    "ratio_cpu": 0.9}},
               "load_avg": [[3.0, 2.5, 2.0], [4.0, 3.0, 2.0]],
               "report": {"optimized_op_counts": {"QLinearConv": 12}, "not_fused": {},
                          "conv_layout": {"wide_kernels": ["conv1/Conv"], "padded_input_channels": []}},
               "profile_ours": {"QLinearConv": 900.0}}
    deploy = {"header": {"isa": ["avx512_vnni"], "deploy_target(auto)": "x86_vnni", "onnxruntime": "1.32.0",
                         "threads": 2, "load_avg_at_start": [3.0, 2.5, 2.0]}, "sections": [section]}
    text = "\n".join(report.deploy_md({"sections": {"deploy": {"status": "ok", "result": deploy}}}))
    assert "| ours | 0.250 | 12.000 | 25.000 | 1.200 | 0.833 |" in text and "load average at start 3.00 / 2.50" in text
    assert "0.92× by minima (ORT PTQ QDQ U8S8), 1.25× by medians, 0.90× by one-thread CPU time" in text
    assert "wide kernels: conv1/Conv" in text and "padded input channels" not in text
    assert "load average (1 / 5 / 15 min) while timing: 3.00 / 2.50 / 2.00 before, 4.00 / 3.00 / 2.00 after" in text
    assert report.deploy_losses(deploy) == ["CREPE tiny b64: ours 1.20× FP32; QLinearConv takes 900 µs of our run"]


def test_each_torch_pruning_row_is_paired_with_our_best_recipe_with_accuracy_after_pruning():
    engine = results()["sections"]["engine"]["result"]
    ours = report.BEST_PRUNE_ROW.format(pct=50)
    engine["rows"] += [
        _row("Torch-Pruning 50 % + ORT PTQ", "peer", 0.8815, 0.18, 2.3, 2.6, 0.7, accuracy_after_pruning=0.671),
        _row(ours, "ours", 0.8823, 0.2, 2.9, 3.4, 2.0, accuracy_after_pruning=0.7761),
        # a slightly better peer: within the noise margin, so not listed as a loss
        _row("Torch-Pruning 50 %", "peer", 0.8835, 0.45, 1.0, 0.8, 0.7, accuracy_after_pruning=0.671),
    ]
    pairs = report.pruning_pairs(engine)
    assert pairs == [
        {"ratio": "50 %", "peer": "Torch-Pruning 50 %", "peer after pruning": "0.6710", "peer top-1": "0.8835",
         "ours": ours, "ours after pruning": "0.7761", "our top-1": "0.8823", "Δ top-1": "-0.12 pt"},
        {"ratio": "50 %", "peer": "Torch-Pruning 50 % + ORT PTQ", "peer after pruning": "0.6710",
         "peer top-1": "0.8815", "ours": ours, "ours after pruning": "0.7761", "our top-1": "0.8823",
         "Δ top-1": "+0.08 pt"},
    ]
    main, _ = report.engine_rows(engine)
    assert next(r for r in main if r["method"] == f"**{ours}**")["top-1 after pruning"] == "0.7761"
    assert not [loss for loss in report.engine_losses(engine) if loss["metric"] == "top-1"
                and loss["peer"].startswith("Torch-Pruning")]
