"""The one place error text from a child that ran a user model becomes text a user may read.

Two steps, because the child itself is untrusted (the model runs in it):
- in the child, `describe` reduces an exception to its type, the stage and either the engine's own
  message (raised by amct_engine or job_process code; capped at EXCERPT_CHARS when it wraps one the
  model raised, as it may quote it) or, for anything raised while the model's code ran (TorchScript
  `raise`, a torch op failing inside `forward`), a short excerpt: the last line only, capped at
  EXCERPT_CHARS. A model's exception text is never passed on whole;
- in the parent, `scrub` is applied again to whatever the child reported (error.json, the validation
  line), so a child that forged its report still cannot return more than a capped, printable line.
Tracebacks, stderr and the model's prints go to the job's log only, never into an answer.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

EXCERPT_CHARS = 200  # of a message raised while the model's code ran
MAX_CHARS = 500  # of any error text a user reads
_ENGINE_DIRS = tuple(str(Path(__file__).resolve().parents[1] / p) + "/" for p in ("amct_engine", "job_process"))
_RAISED = re.compile(r"(?:builtins\.)?([A-Za-z]{1,40}(?:Error|Exception)): ?(.*)")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")  # ASCII printables only: no control codes, no binary
# TorchScript's argument check: its first line names the argument, its last ("Cast error details: …") does not.
_ARGUMENT = re.compile(
    r"Expected a value of type '([^']{1,80})' for argument '(\w{1,60})' but instead found type '([^']{1,80})'"
)


def scrub(text: object, limit: int = MAX_CHARS) -> str:
    """One printable line of at most `limit` characters, cut after a whole word where one ends near the limit."""
    line = _UNPRINTABLE.sub(" ", str(text)).strip()
    line = re.sub(r" {2,}", " ", line)
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit * 3 // 4 else cut) + "…"


def raised_by_engine(e: BaseException) -> bool:
    """True when the innermost Python frame that raised `e` is our own code (not torch running the model)."""
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_ENGINE_DIRS)


def _wraps_model_error(e: BaseException) -> bool:
    seen, inner = set(), e.__cause__ or e.__context__
    while inner is not None and id(inner) not in seen:
        if not raised_by_engine(inner):
            return True
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    return False


def describe(e: BaseException, stage: str, names: dict[str, str] | None = None) -> str:
    """What a user reads about an exception in `stage` (load, forward, capture, training, …); `names` replace
    text before it is capped (a file's path in this process by what the user calls it: "the model file")."""
    name = type(e).__name__
    text = str(e)
    for old, new in (names or {}).items():
        text = text.replace(old, new)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if raised_by_engine(e):
        # Our words; but an engine error wrapping one the model raised may quote it: then capped as an excerpt.
        limit = EXCERPT_CHARS if _wraps_model_error(e) else MAX_CHARS
        return scrub(f"{name}: {' '.join(lines)}" if lines else name, limit)
    # TorchScript puts the real cause on the last line of a long trace of the model's own code, as
    # `builtins.RuntimeError: …` for a `raise` in the model (the Python exception is a torch.jit.Error).
    if argument := next((m for ln in lines if (m := _ARGUMENT.search(ln))), None):
        expected, name, found = argument.groups()
        return scrub(f"the model's argument '{name}' takes {expected}, not the {found} given in {stage}", EXCERPT_CHARS)
    raised = [(i, m) for i, ln in enumerate(lines) if (m := _RAISED.match(ln))]
    if raised:
        last, match = raised[-1]
        name, lines = match.group(1), [match.group(2), *lines[last + 1 :]]
    excerpt = scrub(lines[-1] if lines else "", EXCERPT_CHARS)
    return f"the model raised {name} in {stage}" + (f": {excerpt}" if excerpt else "")
