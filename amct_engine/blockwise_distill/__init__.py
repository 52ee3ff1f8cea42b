"""Block-wise distillation (spec §6): teacher = float model, student = quantised copy."""
