"""The settings of metadata filters and of document access grants (docs/filters.md)."""

from __future__ import annotations

import json
from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class FilterSettings(BaseSettings):
    """Bounds on a request's filter. Variables use the RAGSERVE_FILTER_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_FILTER_", extra="forbid", frozen=True)

    # Conditions in one filter, nested ones counted (each is a mask over the corpus).
    max_conditions: int = Field(default=64, ge=1, le=4096)
    # Filters nested inside filters, the request's own counted as 1.
    max_depth: int = Field(default=4, ge=1, le=32)
    # Values in one `match.any`.
    max_values: int = Field(default=256, ge=1, le=65536)
    # Local index: the most vectors a filtered search scans exactly; below it the index picks a scan
    # or a filtered HNSW walk by their cost (docs/filters.md), above it always the walk.
    exact_scan_max_chunks: int = Field(default=20_000, ge=0)


class GrantSettings(BaseSettings):
    """Which documents each caller may read. Variables use the RAGSERVE_ACCESS_ prefix.

    Off (the default) while `field` is empty: every caller reads every document, as before.
    """

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_ACCESS_", extra="forbid", frozen=True)

    # The keyword metadata field that lists who may read a document (e.g. "groups").
    field: str = ""
    # JSON object: caller name (its mTLS certificate's CN or a SAN) -> the values of `field` it may
    # read, e.g. {"billing-svc": ["finance", "support"], "admin-svc": ["*"]}; "*" reads every document.
    grants: str = "{}"
    # Documents whose `field` holds this value are readable by every caller, granted or not.
    public_value: str = "public"

    def grant_table(self) -> dict[str, tuple[str, ...]]:
        table = json.loads(self.grants or "{}")
        return {str(name): tuple(str(v) for v in values) for name, values in table.items()}

    @model_validator(mode="after")
    def _grants_are_a_table(self) -> Self:
        try:
            table = json.loads(self.grants or "{}")
        except ValueError as exc:
            raise ValueError(f"RAGSERVE_ACCESS_GRANTS is not JSON: {exc}") from None
        if not isinstance(table, dict) or not all(
            isinstance(name, str)
            and name
            and isinstance(values, list)
            and all(isinstance(v, str) and v for v in values)
            for name, values in table.items()
        ):
            raise ValueError(
                'RAGSERVE_ACCESS_GRANTS must be a JSON object of caller name -> list of values, e.g. {"svc": ["eng"]}'
            )
        if table and not self.field:
            raise ValueError(
                "RAGSERVE_ACCESS_GRANTS needs RAGSERVE_ACCESS_FIELD (the metadata field that holds readers)"
            )
        if not self.public_value:
            raise ValueError("RAGSERVE_ACCESS_PUBLIC_VALUE must not be empty")
        # "*" is the grant that reads everything: as the public value it would turn access off
        # without a word, and as a caller name it would name nobody (a literal CN "*").
        if self.public_value == "*":
            raise ValueError('RAGSERVE_ACCESS_PUBLIC_VALUE must not be "*" (it would make every document public)')
        if "*" in table:
            raise ValueError('RAGSERVE_ACCESS_GRANTS: "*" is not a caller name (grant "*" as a value instead)')
        return self
