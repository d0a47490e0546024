"""The generator's training data, made through the product's own path (phase 1 of `tune-generator`).

The SQuAD-format corpus is indexed by the indexer, every question is retrieved as Query retrieves
it (hybrid search, the served fusion, the evidence step), its passages are fitted to the context
budget and rendered by the same code Query uses (request/reply.py `fit_and_build`, the chat
template in generate/rendering.py), so the model learns exactly the prompts it will be served.
The result is a token-id dataset (`examples.jsonl.gz` and `data.json`): the training phase
(generator_model.py) needs only torch, transformers and peft to read it.

Targets: the gold span copied from the passage that holds it, with its citation ("1998 [2]"); the
template's decline sentence when no passage in the prompt holds the answer (SQuAD's unanswerable
questions, and answerable ones whose gold passage retrieval missed or the budget cut). Each
answerable question is also retrieved with its gold paragraph excluded ("excluded": a decline),
which training mixes in at a chosen share.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from indexer.tune.reader_data import SquadQuestion, SquadSet, load_squad, normalize
from ragserve.budget import Deadline, RequestContext
from ragserve.config import AnswerSettings, CacheSettings, IndexSettings, RequestSettings, Settings
from ragserve.generate.rendering import ChatRenderer
from ragserve.request.policy import ABSTAIN_ANSWER
from ragserve.types import Passage, RetrieveParams

log = logging.getLogger(__name__)

EXAMPLES = "examples.jsonl.gz"
DATA_MANIFEST = "data.json"
# A paragraph lands in the held-out share by a hash of its id: every question about it is held out
# together, so held-out figures never ask about a paragraph training saw.
_HELDOUT_SALT = "ragserve-generator-heldout"
# Extra passages asked for when the gold paragraph is excluded, so top_k remain after it is dropped.
_EXCLUDE_SLACK = 4


@dataclass(frozen=True, slots=True)
class DataOptions:
    top_k: int = RequestSettings.model_fields["default_top_k"].get_default()
    # The server's default budget and layout (RequestSettings / AnswerSettings).
    context_token_budget: int = RequestSettings.model_fields["context_token_budget"].get_default()
    heldout_share: float = 0.05
    max_questions: int | None = None


@dataclass(frozen=True, slots=True)
class GeneratorExample:
    qid: str
    kind: str  # answer | impossible | missed (retrieval or the budget lost it) | excluded
    prompt: list[int]
    target: list[int]
    answers: list[str]
    heldout: bool


def is_heldout(doc_id: str, share: float) -> bool:
    bucket = int.from_bytes(hashlib.blake2b(f"{_HELDOUT_SALT}:{doc_id}".encode(), digest_size=4).digest(), "big")
    return bucket / 2**32 < share


def cited_answer(q: SquadQuestion, fitted: list[Passage]) -> str | None:
    """`<gold span> [n]` for the first prompt passage from the gold paragraph that still quotes a
    gold span (the budget may have cut it out); None when none does."""
    for number, passage in enumerate(fitted, start=1):
        if passage.chunk.doc_id != q.doc_id:
            continue
        for answer in q.answers:
            if answer and answer in passage.chunk.text:
                return f"{answer} [{number}]"
    return None


class PromptMaker:
    """Query's retrieval and prompt for one question, on a pipeline without a generator."""

    def __init__(self, pipeline: Any, renderer: ChatRenderer, options: DataOptions) -> None:
        from ragserve.factory.pipeline import answer_policy

        self._pipeline, self._renderer, self._options = pipeline, renderer, options
        self._policy = answer_policy(Settings(answer=AnswerSettings(generation_enabled=False)))

    async def passages(self, question: str, top_k: int) -> list[Passage]:
        params = RetrieveParams(question, top_k, RequestSettings().retrieval_budget_ms)
        result = await self._pipeline.retrieve(params, RequestContext(Deadline(params.budget_ms)))
        return list(result.passages)

    def prompt_ids(self, question: str, passages: list[Passage]) -> tuple[list[int], list[Passage]]:
        from ragserve.request.prompting import fit_and_build
        from ragserve.request.sentences import SentenceTable

        table = SentenceTable.of(question, [p.chunk for p in passages])
        request = RequestContext(Deadline(1000))
        context, prompt = fit_and_build(
            self._policy, question, passages, table, self._options.context_token_budget, self._renderer, request
        )
        return self._renderer.encode(self._renderer.render(prompt)), context.passages


def target_ids(renderer: ChatRenderer, text: str) -> list[int]:
    """The reply's tokens and the end of the assistant turn (what stops the engine)."""
    end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = renderer.encode(text)
    return [*ids, end] if isinstance(end, int) and end >= 0 else [*ids, renderer.tokenizer.eos_token_id]


async def examples_for(
    maker: PromptMaker, renderer: ChatRenderer, q: SquadQuestion, options: DataOptions
) -> list[GeneratorExample]:
    """The question as Query serves it, and (answerable only) again with its gold paragraph excluded."""
    heldout = is_heldout(q.doc_id, options.heldout_share)
    found = await maker.passages(q.question, options.top_k)
    prompt, fitted = maker.prompt_ids(q.question, found)
    answer = None if q.impossible else cited_answer(q, fitted)
    kind = "impossible" if q.impossible else ("answer" if answer else "missed")
    out = [
        GeneratorExample(q.qid, kind, prompt, target_ids(renderer, answer or ABSTAIN_ANSWER), list(q.answers), heldout)
    ]
    if not q.impossible:
        others = [
            p for p in await maker.passages(q.question, options.top_k + _EXCLUDE_SLACK) if p.chunk.doc_id != q.doc_id
        ]
        others = [p for p in others if not any(normalize(a) in normalize(p.chunk.text) for a in q.answers)]
        prompt, _ = maker.prompt_ids(q.question, others[: options.top_k])
        out.append(
            GeneratorExample(q.qid, "excluded", prompt, target_ids(renderer, ABSTAIN_ANSWER), list(q.answers), heldout)
        )
    return out


def index_corpus(corpus: Path, root: Path, progress: bool) -> None:
    """The corpus indexed by the indexer, with its documented defaults (as `ragserve-index build`)."""
    from indexer.build import build_index
    from indexer.embedding import load_embedder
    from ragserve.config import EmbedderSettings

    defaults = EmbedderSettings()
    embedder = load_embedder(defaults.model, "torch", defaults.device, defaults.onnx_int8)
    build_index(corpus, root, embedder, progress=progress)


async def _make_all(
    index: Path, model: str, data: SquadSet, options: DataOptions, progress: bool
) -> list[GeneratorExample]:
    from ragserve.factory.pipeline import make_pipeline

    settings = Settings(
        index=IndexSettings(path=index),
        answer=AnswerSettings(generation_enabled=False),
        cache=CacheSettings(backend="off"),  # every question retrieved afresh
    )
    renderer = ChatRenderer(model)
    renderer.load()
    pipeline = make_pipeline(settings, with_generator=False)
    maker = PromptMaker(pipeline, renderer, options)
    questions = data.questions[: options.max_questions]
    made: list[GeneratorExample] = []
    async with pipeline:
        for q in tqdm(questions, unit="question", desc="prompts", disable=not progress):
            made.extend(await examples_for(maker, renderer, q, options))
    return made


def prepare_generator_data(
    train: Path,
    model: str,
    out: Path,
    options: DataOptions,
    progress: bool = True,
    say: Callable[[str], None] = log.info,
) -> dict[str, Any]:
    """Index `train`'s corpus, make every example, write the dataset folder; its manifest."""
    data = load_squad(train)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragserve-gen-index-") as tmp:
        say(f"indexing {train / 'corpus.jsonl'} ...")
        index_corpus(train / "corpus.jsonl", Path(tmp), progress)
        examples = asyncio.run(_make_all(Path(tmp), model, data, options, progress))
    with gzip.open(out / EXAMPLES, "wt", encoding="utf-8") as handle:
        for example in examples:
            handle.write(json.dumps(asdict(example), separators=(",", ":")) + "\n")
    counts: dict[str, int] = {}
    for example in examples:
        counts[example.kind] = counts.get(example.kind, 0) + 1
    manifest = {
        "source": str(train.name),
        "questions": len(data.questions[: options.max_questions]),
        "examples": counts,
        "heldout_examples": sum(e.heldout for e in examples),
        "prompt_tokens_mean": round(sum(len(e.prompt) for e in examples) / max(1, len(examples)), 1),
        "options": asdict(options),
        "renderer_model": model,
        "decline": ABSTAIN_ANSWER,
        "licence": "SQuAD 2.0 (Rajpurkar, Jia and Liang, 2018), CC BY-SA 4.0",
    }
    (out / DATA_MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest
