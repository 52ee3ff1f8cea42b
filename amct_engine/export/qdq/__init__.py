"""The "onnx" deploy format's passes over the exported graph, one module per pass (docs/spec/engine.md §5).

In the order `finalize.finalize_qdq_deploy` runs them: `boundaries` quantises every tensor between two
quantised layers (with `zero_pads` folding a conv's own Pad, `calibration` for the tensors no quantiser
covers, `codes` moving shape ops onto integer codes); `batch_norm` turns a BatchNorm between quantisers
into an int8 depthwise conv; `activations_on_codes` runs hardswish on integer codes and PReLU as a Max
or a LeakyRelu (no slow float kernel); `names` names nodes and initialisers after their layer; the deploy target's
conv rewrites follow (export/conv_layout.py, conv_int8_paths.py, conv_float_stems.py); `embeddings`
stores lookup tables as int8 rows with per-row scales; `fusion_report`
says what onnxruntime makes of the result. `graph_index` holds what they share.
"""
