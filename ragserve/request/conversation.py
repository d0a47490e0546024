"""What a conversation's history changes on the request path: the query vector.

A follow-up ("When was it founded?") names its subject only in an earlier turn. Retrieval embeds
the question alone and the question with the latest user turns, and blends the two, weighted toward
the question (RetrieveParams.question_weight): the earlier turn brings the subject, the question
keeps the ranking on what is asked now. Lexical search reads the question twice and the turns once
(RetrieveParams.lexical_text), for the same reason: a question that changes the subject must still
win over the turn before it.
"""

from __future__ import annotations

import numpy as np

from ragserve.embed.base import Embedder, QueryEmbedding
from ragserve.types import RetrieveParams


def search_embedding(embedder: Embedder, params: RetrieveParams) -> QueryEmbedding:
    """The query vector (blocking: a model call). With history the vector is never offered to the
    semantic cache (`fits_window` False): it stands for a conversation, not a question."""
    if not params.recent:
        return embedder.embed_query(params.query)
    question, joined = embedder.embed_queries([params.query, params.search_text])
    weight = params.question_weight
    blended = weight * question + (1.0 - weight) * joined
    norm = float(np.linalg.norm(blended))
    vector = (blended / norm if norm > 0 else joined).astype(np.float32)
    return QueryEmbedding(vector, fits_window=False)
