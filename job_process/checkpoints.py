"""Training checkpoints and cooperative cancel inside the engine child.

A checkpoint is one `torch.save` of state dicts and tensors (model, optimizer, the loader's shuffle
generator, torch's RNG) plus counters, written under `ckpt/` with a fresh name and announced with a
`checkpoint` line; the worker uploads it and records it against the job. The next attempt of the job
finds the last one at `resume.pt`. It is loaded ONLY with `torch.load(weights_only=True)`: a
checkpoint holds the user's weights and is no more trusted than the user's model, and weights_only
unpickles tensors and plain containers, nothing callable.

Cancel is a file (`cancel`) the worker creates in the job folder rather than a signal: a file cannot
arrive before a handler is installed (SIGUSR1's default action kills the process, e.g. while torch is
still importing), is not lost, and still works when the child runs in a container or another PID
namespace that shares only the job folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from job_host.protocol import CANCEL_FILE, CHECKPOINT_DIR, RESUME_FILE, emit
from job_process.distributed import SINGLE, Rank, any_rank

FORMAT = 1


class Cancelled(Exception):
    """The worker asked the job to stop."""


class Checkpoints:
    """`every_steps`: None writes no checkpoints (a local run, nobody to resume it); 0 only at epoch
    ends (distillation: group ends); N also every N steps."""

    def __init__(self, workdir: Path, kind: str, every_steps: int | None = None, rank: Rank = SINGLE) -> None:
        self.workdir, self.kind, self.rank = workdir, kind, rank
        # Every rank of a distributed job reads the last checkpoint; rank 0 alone writes them.
        self.enabled = every_steps is not None and rank.leader
        self.every_steps = max(0, int(every_steps or 0))
        self.resumed_from: dict | None = None  # what this attempt resumed from (for the job's metrics)
        self._state = self._load()

    # -- cancel ------------------------------------------------------------------------------------
    def check_cancel(self) -> None:
        """Raise Cancelled when the worker asked the job to stop (one stat() call: cheap per step)."""
        if (self.workdir / CANCEL_FILE).exists():
            raise Cancelled("cancel requested")

    def check_cancel_together(self) -> None:
        """check_cancel, decided by all ranks of a distributed job at once (one rank alone would leave the
        others waiting in the next step's all-reduce)."""
        if any_rank((self.workdir / CANCEL_FILE).exists(), self.rank):
            raise Cancelled("cancel requested")

    # -- reading and writing -----------------------------------------------------------------------
    def _load(self) -> dict | None:
        path = self.workdir / RESUME_FILE
        if not path.exists():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a damaged checkpoint costs the progress it held, not the job
            self._ignore(f"it could not be read ({type(e).__name__}: {e})")
            return None
        if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("kind") != self.kind:
            self._ignore(f"it is not a {self.kind} checkpoint of format {FORMAT}")
            return None
        return state

    @staticmethod
    def _ignore(why: str) -> None:
        emit("log", level="warning", message=f"the job's last checkpoint is not used, {why}; starting over")

    def _resumed(self, state: dict, keys: tuple[str, ...]) -> None:
        self.resumed_from = {k: state[k] for k in keys}
        emit("resumed", **self.resumed_from)

    def save(self, state: dict, **position: int) -> None:
        """Write a checkpoint (temp name, then rename: never half a file) and tell the worker."""
        if not self.enabled:
            return
        folder = self.workdir / CHECKPOINT_DIR
        folder.mkdir(exist_ok=True)
        name = f"step-{position['step']:09d}.pt"
        tmp = folder / f".{name}.tmp"
        torch.save({"format": FORMAT, "kind": self.kind, **position, **state}, tmp)
        os.replace(tmp, folder / name)
        emit("checkpoint", file=name, **position)

    # -- kinds trained with train_epochs ---------------------------------------------------------
    def restore_training(self, model: nn.Module, optimizer: torch.optim.Optimizer, loader) -> int:
        """Put the last checkpoint's state back; the global step to resume from (0: from the start)."""
        state = self._state
        if state is None:
            return 0
        if "optimizer" not in state or state.get("steps_per_epoch") != len(loader):
            self._ignore(f"it was taken with {state.get('steps_per_epoch')} steps per epoch, not {len(loader)}")
            return 0
        if state.get("world_size", 1) != self.rank.world_size:  # each rank's slice of a batch would differ
            self._ignore(f"it was taken with {state.get('world_size', 1)} ranks, not {self.rank.world_size}")
            return 0
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.shuffle.restore(state.get("loader_rng"), int(state["step"]))
        _set_rng(state)
        self._resumed(state, ("epoch", "step"))
        return int(state["step"])

    def training_hook(self, model: nn.Module, optimizer: torch.optim.Optimizer, loader) -> Callable[[dict], None]:
        """Called after every train_epochs step: stop on cancel; checkpoint at epoch ends and every N steps."""
        steps_per_epoch = len(loader)

        def after_step(event: dict) -> None:
            self.check_cancel_together()
            step = event["step"]
            epoch_end = step % steps_per_epoch == 0
            if not self.enabled or not (epoch_end or (self.every_steps and step % self.every_steps == 0)):
                return
            self.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader_rng": loader.shuffle.state(),
                    "world_size": self.rank.world_size,
                    **_rng_state(),
                },
                epoch=step // steps_per_epoch,
                step=step,
                steps_per_epoch=steps_per_epoch,
            )

        return after_step

    # -- distillation: one checkpoint per finished group -----------------------------------------
    def restore_distill(self, student: nn.Module, groups: int, steps_per_group: int) -> int:
        """Load the student of the last checkpoint; how many distill groups are already trained."""
        state = self._state
        if state is None:
            return 0
        if state.get("groups") != groups or state.get("steps_per_group") != steps_per_group:
            self._ignore(
                f"it was taken for {state.get('groups')} groups of {state.get('steps_per_group')} steps, "
                f"not {groups} of {steps_per_group}"
            )
            return 0
        student.load_state_dict(state["model"])
        _set_rng(state)
        self._resumed(state, ("group", "step"))
        return int(state["group"])

    def save_distill(self, student: nn.Module, group: int, step: int, groups: int, steps_per_group: int) -> None:
        self.save(
            {"model": student.state_dict(), **_rng_state()},
            group=group,
            step=step,
            groups=groups,
            steps_per_group=steps_per_group,
        )


def _rng_state() -> dict:
    state = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng(state: dict) -> None:
    if state.get("torch_rng") is not None:
        torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
