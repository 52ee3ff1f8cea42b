"""Errors raised while capturing a model as a graph."""

from __future__ import annotations


class GraphCaptureError(RuntimeError):
    """The model could not be captured as one static graph.

    The message names where capture stopped (the fx node and the line of the user's ``forward``, or the
    TorchScript node kind and its source range) and what the user can do about it.
    """


def first_line(exc: BaseException, limit: int = 240) -> str:
    """The first line of an exception's message, no final period (torch errors run to dozens of lines)."""
    text = str(exc).strip()
    line = text.splitlines()[0].rstrip(". ") if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"
