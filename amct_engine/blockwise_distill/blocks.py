"""Inputs and outputs of one distill group (a chain of modules) inside a whole model.

A group is run by calling its modules one after another (docs/spec/engine.md §6.2), so its input is captured
with a forward pre-hook on its first module, and the rest of the model's forward is skipped by
raising from that hook.
"""

from __future__ import annotations

import torch
from torch import nn


class _GroupInputReached(Exception):
    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value


def group_input(model: nn.Module, first: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The tensor `first` receives when `model(*inputs)` runs (the model stops right there)."""

    def hook(_module, args):
        raise _GroupInputReached(args[0])

    handle = first.register_forward_pre_hook(hook)
    try:
        model(*inputs)
    except _GroupInputReached as reached:
        return reached.value
    finally:
        handle.remove()
    raise RuntimeError(f"the model never called {type(first).__name__} during its forward")


def run_chain(modules: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for module in modules:
        x = module(x)
    return x


def resolve_group(model: nn.Module, names: list[str], role: str) -> list[nn.Module]:
    """The modules of a group by path, with an error naming the missing one."""
    modules = []
    for name in names:
        try:
            modules.append(model.get_submodule(name))
        except AttributeError:
            raise ValueError(f"distill group {names}: the {role} model has no module {name!r}") from None
    return modules


def pick_student_input(teacher_in: torch.Tensor, student_in: torch.Tensor) -> torch.Tensor:
    """docs/spec/engine.md §6.2: use the teacher's input when the student's has drifted too far from it."""
    drift = torch.mean((teacher_in - student_in) ** 2)
    limit = 0.5 * torch.minimum(torch.mean(teacher_in**2), torch.mean(student_in**2))
    return teacher_in if drift > limit else student_in
