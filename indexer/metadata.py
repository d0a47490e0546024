"""Document metadata in: YAML front matter, `<file>.meta.json`, a BEIR line's `metadata`, derived fields;
then the version's filterable fields, checked.

Precedence: the `.meta.json` beside the file over front matter; the derived fields (path, folder,
file_type, modified, title) over both, so an author cannot move a document for a filter (a title
the author gives is the derived title). A field is filterable when the user declares its type
(`--field name:type`) or, undeclared, when all its values share one scalar type (integers and
floats together are float). A document whose value does not fit its field's type is skipped with
the reason, never indexed half; an undeclared field of mixed types is left out of filters, named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from ragserve.filters import FIELD_TYPES, FieldSchema, coerce_value

SIDECAR_SUFFIX = ".meta.json"
# Front matter or a sidecar larger than this is not metadata: the document is skipped.
MAX_METADATA_BYTES = 64 * 1024
MAX_FIELDS = 64
MAX_FIELD_NAME_CHARS = 64
MAX_VALUES_PER_FIELD = 256
_FRONT_MATTER_FENCE = "---"


class MetadataError(ValueError):
    """A document's metadata cannot be read or does not fit its fields: the document is skipped."""


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """A Markdown file's YAML front matter (between `---` lines at its very start) and the rest."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != _FRONT_MATTER_FENCE:
        return {}, text
    for end in range(1, len(lines)):
        if lines[end].strip() in (_FRONT_MATTER_FENCE, "..."):
            block = "\n".join(lines[1:end])
            if len(block.encode()) > MAX_METADATA_BYTES:
                raise MetadataError(f"front matter is over {MAX_METADATA_BYTES} bytes")
            import yaml

            try:
                data = yaml.safe_load(block) if block.strip() else {}
            except yaml.YAMLError as exc:
                raise MetadataError(f"front matter is not YAML: {str(exc).splitlines()[0]}") from None
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise MetadataError("front matter is not a mapping of fields")
            return data, "\n".join(lines[end + 1 :])
    return {}, text  # no closing fence: not front matter


def sidecar_metadata(path: Path) -> dict[str, Any]:
    """`<file>.meta.json` beside `path` (a JSON object), or {} when there is none."""
    sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
    if not sidecar.is_file() or sidecar.is_symlink():
        return {}
    if sidecar.stat().st_size > MAX_METADATA_BYTES:
        raise MetadataError(f"{sidecar.name} is over {MAX_METADATA_BYTES} bytes")
    try:
        data = json.loads(sidecar.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise MetadataError(f"{sidecar.name} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MetadataError(f"{sidecar.name} is not a JSON object")
    return data


def derived_fields(relative: str, path: Path | None, title: str) -> dict[str, Any]:
    """What the indexer knows of every document itself."""
    out: dict[str, Any] = {"title": title} if title else {}
    if path is not None:
        posix = PurePosixPath(relative)
        out["path"] = relative
        out["folder"] = str(posix.parent) if str(posix.parent) != "." else "/"
        if posix.suffix:
            out["file_type"] = posix.suffix.lstrip(".").lower()
        out["modified"] = datetime.fromtimestamp(os.stat(path).st_mtime, tz=UTC)
    return out


def _kind_of(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, datetime | date):
        return "datetime"
    if isinstance(value, str):
        return "keyword"
    return None


def _values(value: Any) -> list[Any] | None:
    """A field's values (a scalar is one), or None when it is not a scalar or a list of them."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    if any(_kind_of(item) is None for item in items):
        return None
    return items


@dataclass
class Fields:
    """The version's filterable fields, and the fields left out with why."""

    schema: FieldSchema
    left_out: dict[str, str] = field(default_factory=dict)


def parse_declared(specs: list[str]) -> dict[str, str]:
    """`name:type` flags (ValueError naming the bad one)."""
    declared: dict[str, str] = {}
    for spec in specs:
        name, _, kind = spec.partition(":")
        if not name or kind not in FIELD_TYPES:
            raise ValueError(f"--field {spec!r}: give name:type with type one of {', '.join(FIELD_TYPES)}")
        declared[name] = kind
    return declared


def choose_fields(metadata: list[Mapping[str, Any]], declared: Mapping[str, str]) -> Fields:
    """Declared fields as declared; others where every document's values share one scalar type."""
    kinds: dict[str, set[str]] = {}
    unusable: set[str] = set()
    for meta in metadata:
        for name, value in meta.items():
            values = _values(value)
            if values is None:
                unusable.add(name)
                continue
            kinds.setdefault(name, set()).update(k for k in map(_kind_of, values) if k is not None)
    chosen = dict(declared)
    left_out: dict[str, str] = {}
    for name in sorted(set(kinds) | unusable):
        if name in declared:
            continue
        found = kinds.get(name, set())
        if found == {"integer", "float"}:
            found = {"float"}
        if name in unusable:
            left_out[name] = "holds objects or nested lists"
        elif len(found) == 1:
            chosen[name] = found.pop()
        elif found:
            left_out[name] = f"mixed types ({', '.join(sorted(found))}); declare it with --field {name}:TYPE"
    if len(chosen) > MAX_FIELDS:
        for name in sorted(chosen)[MAX_FIELDS:]:
            if name not in declared:
                left_out[name] = f"more than {MAX_FIELDS} fields"
                del chosen[name]
    return Fields(FieldSchema(chosen), left_out)


def normalized(meta: Mapping[str, Any], schema: Mapping[str, str]) -> dict[str, Any]:
    """A document's values of the schema's fields, as the index stores them (MetadataError: the
    first value that does not fit, naming the field)."""
    out: dict[str, Any] = {}
    for name, kind in schema.items():
        if name not in meta or meta[name] is None:
            continue
        values = _values(meta[name])
        if values is None:
            raise MetadataError(f"metadata field {name!r} is {kind} but holds an object or a nested list")
        if len(values) > MAX_VALUES_PER_FIELD:
            raise MetadataError(f"metadata field {name!r} holds more than {MAX_VALUES_PER_FIELD} values")
        try:
            coerced = [coerce_value(kind, v) for v in values]
        except (ValueError, OverflowError) as exc:
            raise MetadataError(f"metadata field {name!r} is {kind}: {exc}") from None
        if coerced:
            out[name] = coerced if isinstance(meta[name], list | tuple) else coerced[0]
    return out


def check_names(meta: Mapping[Any, Any]) -> dict[str, Any]:
    """Field names are short non-empty strings without dots (Qdrant reads a dot as nesting)."""
    for name in meta:
        if not isinstance(name, str) or not name or len(name) > MAX_FIELD_NAME_CHARS or "." in name:
            raise MetadataError(f"metadata field name {str(name)[:MAX_FIELD_NAME_CHARS]!r} is not a plain name")
    return dict(meta)
