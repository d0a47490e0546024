"""How a generated answer scores against SQuAD gold spans (standard library only: the training host
computes held-out figures with it, and the benchmark its dev figures)."""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
# A trailing citation, "[2]" or "[1][3]", is not part of the answer's text.
_CITATION = re.compile(r"\s*(?:\[\d+\]\s*)+\.?\s*$")


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles removed, spaces collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def without_citation(answer: str) -> str:
    return _CITATION.sub("", answer.strip())


def holds_gold(answer: str, golds: list[str]) -> bool:
    padded = f" {normalize(answer)} "
    return any(f" {gold} " in padded for gold in map(normalize, golds) if gold)


def exact_match(answer: str, golds: list[str]) -> bool:
    text = normalize(without_citation(answer))
    return any(text == normalize(gold) for gold in golds if gold)


def is_decline(answer: str, decline: str) -> bool:
    """The template's decline sentence, exactly (a citation or quotes around it allowed); the
    serving side's test is ragserve.prompt.is_decline, for the template's own sentence."""
    return re.sub(r"\s*\[\d+\]", "", answer).strip().strip('"').strip().rstrip(".") == decline.rstrip(".")
