"""Versioned JSON documents (profiles, plans): typed field reading and atomic saving in one place.

A document carries `kind` (which sort of file it is) and `schema_version` (which layout); both
are checked before any other field. Every reading error is a ValueError (FileNotFoundError for
a missing file) that names the file, the field, the bad value and how to fix it.
"""
from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from morphpipe.outputs import write_text_atomic

Document = TypeVar("Document", bound="JsonDocument")


class FieldReader:
    """Reads typed fields of one JSON object; every error names the file, the field and the fix."""

    def __init__(self, data: Any, source: str, fix: str, path: str = "") -> None:
        self.source = source
        self.fix = fix
        self.path = path
        if not isinstance(data, dict):
            raise ValueError(f"{source}: {self._where()} must be a JSON object, got {_show(data)}; {fix}")
        self.data: dict[str, Any] = data

    def _where(self, name: str | None = None) -> str:
        full = f"{self.path}.{name}" if self.path and name else (name or self.path)
        return f"field '{full}'" if full else "the top level"

    def error(self, name: str, problem: str, value: Any) -> ValueError:
        """A ValueError naming the field, the problem, the bad value and the fix."""
        return ValueError(f"{self.source}: {self._where(name)} {problem}, got {_show(value)}; {self.fix}")

    @contextmanager
    def as_document_errors(self) -> Iterator[None]:
        """Reports a ValueError raised inside (a constructor's own checks) as this document's: file first, fix last."""
        try:
            yield
        except ValueError as error:
            if str(error).startswith(self.source):
                raise
            raise ValueError(f"{self.source}: {error}; {self.fix}") from None

    def _get(self, name: str, optional: bool) -> Any:
        if name not in self.data:
            if optional:
                return None
            raise ValueError(f"{self.source}: {self._where(name)} is missing; {self.fix}")
        return self.data[name]

    def number(self, name: str, *, minimum: float | None = None, positive: bool = False,
               optional: bool = False) -> float | None:
        """A finite JSON number (ints accepted), optionally bounded below."""
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(name, "must be a finite number", value)
        if positive and value <= 0:
            raise self.error(name, "must be > 0", value)
        if minimum is not None and value < minimum:
            raise self.error(name, f"must be >= {minimum}", value)
        return float(value)

    def integer(self, name: str, *, minimum: int | None = None, optional: bool = False) -> int | None:
        """A JSON integer, optionally bounded below."""
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, "must be an integer", value)
        if minimum is not None and value < minimum:
            raise self.error(name, f"must be >= {minimum}", value)
        return value

    def boolean(self, name: str) -> bool:
        """A JSON true or false."""
        value = self._get(name, optional=False)
        if not isinstance(value, bool):
            raise self.error(name, "must be true or false", value)
        return value

    def string(self, name: str, *, choices: Iterable[str] | None = None, optional: bool = False) -> str | None:
        """A JSON string, optionally one of `choices`."""
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.error(name, "must be a string", value)
        if choices is not None and value not in tuple(choices):
            raise self.error(name, f"must be one of {', '.join(repr(c) for c in choices)}", value)
        return value

    def section(self, name: str, *, optional: bool = False) -> FieldReader | None:
        """A nested JSON object, read with the same source and fix."""
        value = self._get(name, optional)
        if value is None and optional:
            return None
        full = f"{self.path}.{name}" if self.path else name
        return FieldReader(value, self.source, self.fix, full)

    def sections(self, name: str) -> list[FieldReader]:
        """A JSON list of objects."""
        value = self._get(name, False)
        if not isinstance(value, list):
            raise self.error(name, "must be a list", value)
        full = f"{self.path}.{name}" if self.path else name
        return [FieldReader(item, self.source, self.fix, f"{full}[{i}]") for i, item in enumerate(value)]

    def scalars(self, name: str, *, optional: bool = False) -> dict[str, str | int | float | bool | None]:
        """A JSON object of plain scalars (free-form metadata)."""
        value = self._get(name, optional)
        if value is None and optional:
            return {}
        if not isinstance(value, dict) or not all(
            isinstance(v, (str, int, float, bool)) or v is None for v in value.values()
        ):
            raise self.error(name, "must be an object of strings, numbers or booleans", value)
        return dict(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class JsonDocument(ABC):
    """A versioned JSON document: `save`, `load` and `from_dict` around the subclass's `to_dict` and `from_fields`.

    A subclass names its `DOCUMENT_KIND`, the `DOCUMENT_SCHEMA_VERSION` it reads and writes, the
    `DOCUMENT_FIX` every error ends with, and the `DOCUMENT_SOURCE` that in-memory documents are called.
    """

    DOCUMENT_KIND: ClassVar[str]
    DOCUMENT_SCHEMA_VERSION: ClassVar[int]
    DOCUMENT_FIX: ClassVar[str]
    DOCUMENT_SOURCE: ClassVar[str]

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready document, `kind` and `schema_version` included."""

    @classmethod
    @abstractmethod
    def from_fields(cls: type[Document], reader: FieldReader) -> Document:
        """Reads and validates every field after the header has been checked."""

    def save(self, path: str | Path) -> None:
        """Writes the document as JSON atomically: a failed or interrupted write leaves the previous file as it was."""
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n")

    @classmethod
    def load(cls: type[Document], path: str | Path) -> Document:
        """Reads a document file, checking its kind, its schema version and every field."""
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(f"{source}: no such file; {cls.DOCUMENT_FIX}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{source}: not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}); "
                f"{cls.DOCUMENT_FIX}"
            ) from None
        return cls._from_reader(FieldReader(data, source, cls.DOCUMENT_FIX))

    @classmethod
    def from_dict(cls: type[Document], data: Mapping[str, Any], source: str | None = None) -> Document:
        """Validates an in-memory document (same checks as `load`)."""
        document = dict(data) if isinstance(data, Mapping) else data
        return cls._from_reader(FieldReader(document, source or cls.DOCUMENT_SOURCE, cls.DOCUMENT_FIX))

    @classmethod
    def _from_reader(cls: type[Document], reader: FieldReader) -> Document:
        """Checks `kind` (the right sort of file) and `schema_version` (one this code reads), then the fields."""
        found_kind = reader.string("kind")
        if found_kind != cls.DOCUMENT_KIND:
            raise reader.error("kind", f"must be {cls.DOCUMENT_KIND!r} (is this the right file?)", found_kind)
        version = reader.integer("schema_version", minimum=1)
        if version > cls.DOCUMENT_SCHEMA_VERSION:
            raise ValueError(
                f"{reader.source}: field 'schema_version' is {version}, but this morphpipe reads schema "
                f"{cls.DOCUMENT_SCHEMA_VERSION}; upgrade morphpipe, or {reader.fix}"
            )
        if version < cls.DOCUMENT_SCHEMA_VERSION:
            raise ValueError(
                f"{reader.source}: field 'schema_version' is {version}, an older schema than "
                f"{cls.DOCUMENT_SCHEMA_VERSION} that this morphpipe no longer reads; {reader.fix}"
            )
        return cls.from_fields(reader)
