"""LLM weight quantisation, AMCT's way: ``quantize`` -> calibration forward -> ``convert``, and
``export_onnx`` to an ONNX Runtime file (docs/spec/llm.md)."""
