"""Text datasets for the LLM kinds: a UTF-8 `.txt` file, or `.jsonl` with a string "text" field per line.

Told apart by the file's name (`text_format`): every non-blank line of a jsonl file must be a JSON object with a
"text" string; a .txt file is any UTF-8 text without NUL bytes. The API describes an upload in one streamed pass
(records, characters, lines); the job process reads the records back with `read_records` and tokenises them with
the model's tokenizer. Torch-free.
"""

from __future__ import annotations

import codecs
import json

TEXT_SUFFIXES = {"text": ".txt", "jsonl": ".jsonl"}
CHUNK = 1 << 20
RECORD_SEPARATOR = "\n\n"  # between jsonl records when the job joins them into one stream of tokens


class TextDataError(ValueError):
    """A text dataset that does not read: `line` (1-based) where known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def _lines(path: str):
    """(line number, line) of the file decoded as UTF-8, a chunk at a time; TextDataError where it is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending, number = "", 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                raise TextDataError(
                    f"the file is not UTF-8 text ({e.reason} near line {number + 1})", number + 1
                ) from None
            parts = (pending + text).split("\n")
            pending = parts.pop()
            for part in parts:
                number += 1
                yield number, part
            if not chunk:
                break
    if pending:
        yield number + 1, pending


def text_format(filename: str | None) -> str | None:
    """'text' for a `.txt` name, 'jsonl' for `.jsonl`, else None: a text dataset says what it is by its name (any
    bytes decode as some text, so content alone would take a mistyped array file for text)."""
    name = (filename or "").lower()
    return next((fmt for fmt, suffix in TEXT_SUFFIXES.items() if name.endswith(suffix)), None)


def _record(number: int, line: str) -> str:
    try:
        value = json.loads(line)
    except ValueError as e:
        raise TextDataError(f"line {number} is not valid JSON ({e})", number) from None
    text = value.get("text") if isinstance(value, dict) else None
    if not isinstance(text, str):
        raise TextDataError(f'line {number} has no "text" string field', number)
    return text


def read_records(path: str, fmt: str):
    """The texts: each non-blank jsonl line's "text", or the whole plain-text file as one record."""
    if fmt == "jsonl":
        for number, line in _lines(path):
            if line.strip():
                yield _record(number, line)
        return
    yield "\n".join(line for _, line in _lines(path))


def describe_text(path: str, fmt: str) -> dict:
    """What the dataset upload records: records, characters, lines (one pass; TextDataError naming a bad line)."""
    records = characters = lines = 0
    if fmt == "jsonl":
        for number, line in _lines(path):
            lines = number
            if line.strip():
                records += 1
                characters += len(_record(number, line))
    else:
        for number, line in _lines(path):
            if "\x00" in line:
                raise TextDataError("the file holds NUL bytes: not a text file", number)
            lines, characters = number, characters + len(line) + 1
        records = 1
    if not characters:
        raise TextDataError("the file holds no text")
    text = {"format": fmt, "records": records, "characters": characters, "lines": lines}
    return {"text": text, "samples": records, "has_labels": False}
