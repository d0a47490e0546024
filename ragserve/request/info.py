"""What a pipeline serves with now, for Info: the index version and what a caller's grant reads
of it, the embedder, reranker and reader, warming, reloads, and the generator's settings and pace."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from ragserve.filters import Filter
from ragserve.generate.base import Generator
from ragserve.generate.host_share import HostSharePace
from ragserve.reports import PipelineInfo, WarmState
from ragserve.request.reading import ReadingStage
from ragserve.request.serving import ServingVersion, VersionSource
from ragserve.types import model_name


@dataclass(frozen=True, slots=True)
class InfoParts:
    """The parts of a pipeline Info reports on, as they are now."""

    serving: ServingVersion
    versions: VersionSource  # when it began serving, the last version it refused
    generator: Generator | None
    reading: ReadingStage | None
    pace: HostSharePace
    warming: WarmState


def pipeline_info(parts: InfoParts, grant: Filter | None, chunks: int | None) -> PipelineInfo:
    """`chunks`: the count of chunks `grant` reads, when already counted (else counted here)."""
    serving, generator, reading = parts.serving, parts.generator, parts.reading
    about = PipelineInfo(
        index_version=serving.index.version,
        index_chunks=serving.index.count_matching(grant) if chunks is None else chunks,
        embedder_model=model_name(serving.embedder.model_id),  # a name, never the server's path
        rerank_tiers=tuple(serving.reranker.describe()) if serving.reranker is not None else (),
        warming=parts.warming,
        index_served_s=time.time() - parts.versions.served_since,
        last_reload_refusal=parts.versions.last_refusal,
        reader_model=reading.model_id if reading is not None else "",
        reader_threshold=reading.threshold if reading is not None else 0.0,
    )
    if generator is None:
        return about
    status = generator.status()
    return dataclasses.replace(
        about,
        generator_model=generator.model_id,
        generator_unfinished_requests=generator.unfinished_requests(),
        generator_settings=tuple(generator.engine_choices),
        host_cpu=generator.host_cpu,
        generator_pace=parts.pace.describe(status.host_share),
        generator=status,
    )
