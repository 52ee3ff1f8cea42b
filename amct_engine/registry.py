"""The one table per extension point: a name -> entry mapping with clear errors.

Job kinds, deploy formats, weight quantisers, prunable layer types and pruning importance
criteria each live in one `Registry`; schemas, CLI choices, config readers and runners all read
the same object (docs/architecture.md, "Extension points"). Entries may name their
implementation as ``"package.module:attribute"`` so that a table can be read without importing
what it points at (the API process reads the job-kind and deploy-format tables without torch).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, ItemsView, Iterator, ValuesView
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownEntry(KeyError):
    """A name no entry of the registry has; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what  # "job kind", "deploy format", …: used in error messages
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        if name in self._entries and not replace:
            raise ValueError(f"a {self.what} named {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownEntry(self.unknown_message(name)) from None

    def unknown_message(self, name: object) -> str:
        close = difflib.get_close_matches(str(name), self._entries, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.what} {name!r}{hint}; known: {', '.join(self._entries)}"

    def get(self, name: str, default: T | None = None) -> T | None:
        return self._entries.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> ItemsView[str, T]:
        return self._entries.items()

    def values(self) -> ValuesView[T]:
        return self._entries.values()


def load_object(path: str) -> Any:
    """``"package.module:attribute"`` -> the attribute, imported on first use."""
    module_name, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"{path!r} is not of the form 'package.module:attribute'")
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 ``__getattr__`` and ``__dir__`` for a package whose public names (name -> defining
    module) load on first use, so importing the package imports none of them (nor torch)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        vars(importlib.import_module(package))[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
