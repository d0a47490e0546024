"""The follow-up set of bench_conversation.py, built from SQuAD questions by one stated rule (the
rule is described in bench_conversation.py's docstring)."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path
from typing import Any

_STOP_WORDS = (
    "a an the of in on to is was were are be been did does do for by with and or that this these those as at from "
    "it its their they what which who whom whose when where why how type kind term name many much most some any "
    "other than into during after before not no one two can could would should may might will has have had"
)
STOP = frozenset(_STOP_WORDS.split())
_WORD = re.compile("[A-Za-z0-9][\\w'\u2019=-]*")
_POSSESSIVE = re.compile("(?:'s|\u2019s|')$")


def _norm(word: str) -> str:
    return _POSSESSIVE.sub("", word).lower()


def _words(text: str) -> list[re.Match[str]]:
    return list(_WORD.finditer(text))


def _grams(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for n in range(1, 5) for i in range(len(words) - n + 1)}


def _rewrite(a: str, b: str, rare: collections.Counter[tuple[str, ...]]) -> tuple[str, str] | None:
    """B with the longest phrase it shares with A replaced by a pronoun, and that phrase; None: none."""
    shared = _grams([_norm(m.group(0)) for m in _words(a)])
    found = _words(b)
    words = [_norm(m.group(0)) for m in found]
    for n in range(4, 0, -1):
        for i in range(1, len(words) - n + 1):
            gram = tuple(words[i : i + n])
            named = n > 1 or found[i].group(0)[:1].isupper()
            if (
                gram in shared
                and gram[0] not in STOP
                and gram[-1] not in STOP
                and sum(map(len, gram)) >= 4
                and rare[gram] <= 2
                and named
            ):
                start, end = found[i].start(), found[i + n - 1].end()
                if words[i - 1] in ("the", "a", "an"):
                    start = found[i - 1].start()
                last = found[i + n - 1].group(0)
                plural = gram[-1].endswith("s") and not gram[-1].endswith(("ss", "us", "is"))
                possessive = bool(_POSSESSIVE.search(last))
                pronoun = ("their" if plural else "its") if possessive else ("they" if plural else "it")
                return b[:start] + pronoun + b[end:], " ".join(gram)
    return None


def follow_ups(data: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (data / "questions.jsonl").open() if line.strip()]
    by_paragraph: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        if not row["impossible"]:
            by_paragraph[row["doc_id"]].append(row)
    rare: collections.Counter[tuple[str, ...]] = collections.Counter()
    for questions in by_paragraph.values():
        grams: set[tuple[str, ...]] = set()
        for q in questions:
            grams |= _grams([_norm(m.group(0)) for m in _words(q["question"])])
        rare.update(grams)  # in how many paragraphs' questions each phrase occurs
    out = []
    for paragraph in sorted(by_paragraph):
        questions = by_paragraph[paragraph]
        for j, b in enumerate(questions):
            best: tuple[dict[str, Any], tuple[str, str]] | None = None
            for a in questions[:j]:
                made = _rewrite(a["question"].strip(), b["question"].strip(), rare)
                if made and (best is None or len(made[1]) > len(best[1][1])):
                    best = (a, made)
            if best is not None:
                a, (question, phrase) = best
                out.append(
                    {
                        "paragraph": paragraph,
                        "first": a["question"].strip(),
                        "first_answer": a["answers"][0],
                        "original": b["question"].strip(),
                        "follow_up": question,
                        "phrase": phrase,
                    }
                )
    return out
