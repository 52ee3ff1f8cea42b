"""Picking the model inputs out of a data-loader batch (docs/spec/engine.md §1.5 DistillSampleBase)."""

from __future__ import annotations

import torch


class DistillSampleBase:
    """Subclass and override `get_model_input_data` for batches that are not `(inputs, ...)`."""

    @staticmethod
    def get_model_input_data(samples):
        raise NotImplementedError


class ModelSingleTensorInput(DistillSampleBase):
    """The default: `samples[0]` of a list/tuple batch, or the batch itself when it is a tensor."""

    @staticmethod
    def get_model_input_data(samples):
        if isinstance(samples, (list, tuple)):
            return samples[0]
        return samples


def model_inputs(sample: DistillSampleBase, batch) -> tuple[torch.Tensor, ...]:
    """The batch's model inputs as a tuple of tensors, or the error AMCT gives (RuntimeError)."""
    data = sample.get_model_input_data(batch)
    if isinstance(data, torch.Tensor):
        return (data,)
    if isinstance(data, (list, tuple)) and data and all(isinstance(t, torch.Tensor) for t in data):
        return tuple(data)
    raise RuntimeError(
        f"get_model_input_data must return a tensor or a list/tuple of tensors, got {type(data).__name__}"
    )
