"""Errors raised while reading AMCT ``.cfg`` files (protobuf text format, docs/spec/engine.md §2.1/§2.2).

A ``ConfigError`` points at the place in the user's file that is wrong, in the
``path:line:column: message`` form that editors and compilers use, so a user can
jump straight to the offending field.
"""

from __future__ import annotations


def format_location(path: str, line: int | None, column: int | None) -> str:
    """``path:line:column`` with the unknown parts left out."""
    if line is None:
        return str(path)
    if column is None:
        return f"{path}:{line}"
    return f"{path}:{line}:{column}"


class ConfigWarning(UserWarning):
    """A ``.cfg`` that works but is probably not what the user meant (repeated skip
    entries, layer names that are not in the model). A UserWarning, so it shows by default."""


class ConfigError(ValueError):
    """A ``.cfg`` file that does not parse or does not make sense.

    Attributes:
        path: the file path as the caller gave it (``str(path)``), or ``"<string>"``.
        line, column: 1-based position in the file, or None when unknown.
        field: dotted path of the field concerned, in protobuf's own notation
            (``override_layer_configs[0].prune_config``), or None.
        message: the human-readable explanation, without the location prefix.
    """

    def __init__(
        self,
        message: str,
        path: str = "<string>",
        line: int | None = None,
        column: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.path = str(path)
        self.line = line
        self.column = column
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        return f"{format_location(self.path, self.line, self.column)}: {self.message}"

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self):
        # ValueError pickles only ``args``; keep every attribute so the error survives
        # multiprocessing (e.g. DataLoader workers) intact.
        return (type(self), (self.message, self.path, self.line, self.column, self.field))
