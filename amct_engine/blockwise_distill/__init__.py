"""Block-wise distillation (docs/spec/engine.md §6): teacher = float model, student = quantised copy."""
