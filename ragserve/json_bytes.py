"""JSON as bytes for values that are kept (a cache entry, a docstore record held by a build).

orjson's `dumps` hands back bytes whose allocation is rounded up (4 KiB and more for a record of
a few hundred bytes, orjson 3.12 and later); `sys.getsizeof` does not show it. Kept by the
hundred thousand, that is gigabytes: measured at 393 MiB for 100,000 records of about 150 bytes
(BENCHMARKS.md, "A million passages"). A copy is allocated to its length.
"""

from __future__ import annotations

from typing import Any

import orjson


def kept_json(value: Any, option: int | None = None) -> bytes:
    """`orjson.dumps(value)`, copied into bytes of its own length."""
    return bytes(memoryview(orjson.dumps(value, option=option)))
