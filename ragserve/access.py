"""Document access grants: which documents a caller may read, as a filter the caller cannot widen.

A document lists its readers in one keyword metadata field (RAGSERVE_ACCESS_FIELD, e.g.
`groups: [finance, support]`). The operator grants each caller, named by its mTLS certificate,
some of those values (RAGSERVE_ACCESS_GRANTS). Every request carries the caller's grant beside its
own filter (RetrieveParams.grant), and search keeps to both; documents marked with the public value
are readable by all, and a caller with no grant reads only those. docs/filters.md has the threat model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ragserve.filters import Filter, Match

# A grant value that reads every document, whatever its field holds (or lacks).
EVERYTHING = "*"


@dataclass(frozen=True)
class AccessPolicy:
    """`field` empty: access control is off and every caller reads everything."""

    field: str = ""
    grants: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    public_value: str = "public"

    @property
    def enabled(self) -> bool:
        return bool(self.field)

    def grant_for(self, caller_names: Iterable[str]) -> Filter | None:
        """The filter that bounds what a caller with these names reads (the union of their grants
        and the public value); None when it may read everything (or access control is off)."""
        if not self.field:
            return None
        values = {self.public_value}
        for name in caller_names:
            values.update(self.grants.get(name, ()))
        if EVERYTHING in values:
            return None
        return Filter(must=(Match(self.field, tuple(sorted(values)), any=True),))
