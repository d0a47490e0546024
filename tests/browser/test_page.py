"""The page in a real browser (Debian's Chromium through Playwright) over the real front, embedder
and index, with a generator fake: a question streams its answer in, each citation becomes a link
before the final event and opens its quote in its source, a decline shows as one, an unsupported
answer is flagged, a wrong key gets a clear message. Each state's screenshot is written to
test-output/page/ (PAGE_TEST_OUTPUT moves it), with the page's own time per streamed answer."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.page_server import PageServer, output_folder

pytestmark = pytest.mark.browser

SUPPORTED = ["The launch ", "code is ", "4417 [", "1", "]", " for", " Project", " Zephyr", "."]
INVENTED = ["It was ", "painted purple in 1887 ", "[1]", "."]
DECLINE = ["The documents do not contain the answer."]
QUESTION = "What is the launch code of Project Zephyr?"


@pytest.fixture
def page(browser: Any, page_server: PageServer) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 760})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    opened.on("pageerror", lambda error: problems.append(str(error)))
    opened.goto(f"{page_server.url}/ui/")
    yield opened
    context.close()
    # A Content-Security-Policy refusal or a script error shows here (a 401 on purpose does too).
    assert not [p for p in problems if "401" not in p], problems


def _ask(page: Any, question: str, key: str) -> None:
    page.fill("#key", key)
    page.fill("#question", question)
    page.click("#send")


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(output_folder() / f"{name}.png"))


def test_a_question_streams_in_and_a_citation_opens_its_quote_in_its_source(page: Any, page_server: PageServer) -> None:
    page_server.generator.words = SUPPORTED
    page_server.generator.delay_s = 0.25  # the tokens after the citation take a second to come
    _ask(page, QUESTION, page_server.keys["alice"])
    page.wait_for_selector("#passages li")
    assert "Project Zephyr launch code" in page.inner_text("#passages li:first-child")
    assert page.inner_text("#passages li:first-child mark")  # its highlight
    page.wait_for_selector("#answer a.cite")
    # The link is there while the answer is still streaming: before the final event.
    assert page.get_attribute("#answer", "data-state") == "streaming"
    assert page.inner_text("#answer").startswith("The launch code is 4417 [1]")
    _shot(page, "streaming")
    page.wait_for_selector("#answer[data-state=done]")
    events = page.evaluate("window.ragservePage.answers[0].events")
    kinds = [kind for kind, _ in events]
    assert kinds == ["retrieval", "citation", "final"]
    assert events[1][1] < events[2][1]
    assert page.inner_text("#answer") == "The launch code is 4417 [1] for Project Zephyr."
    assert page.is_hidden("#verdict")
    assert page.locator("#timeline .stage").count() >= 5  # embed, search, ..., generation
    assert page.locator("#ttft rect").count() == 1
    assert page.inner_text("#info").count("index version") == 1
    _shot(page, "answer")
    page.click("#answer a.cite")
    page.wait_for_selector("#source[data-state=shown]")
    quote = page.inner_text("#source-text mark")
    assert "The launch code of Project Zephyr is 4417." in quote
    assert "zephyr-launch.md" in page.inner_text("#source-where")
    assert "Project Zephyr launch code" in page.inner_text("#source-where")  # its section path
    _shot(page, "source")


def test_a_decline_shows_as_a_decline(page: Any, page_server: PageServer) -> None:
    page_server.generator.words, page_server.generator.delay_s = DECLINE, 0.0
    _ask(page, "How do I bake sourdough bread with rye flour?", page_server.keys["bob"])
    page.wait_for_selector("#verdict[data-kind=declined]")
    assert "Declined" in page.inner_text("#verdict")
    assert "declined" in (page.get_attribute("#answer", "class") or "")
    _shot(page, "declined")


def test_an_unsupported_answer_is_flagged(page: Any, page_server: PageServer) -> None:
    page_server.generator.words, page_server.generator.delay_s = INVENTED, 0.0
    _ask(page, "What colour was Project Zephyr's balloon?", page_server.keys["bob"])
    page.wait_for_selector("#verdict[data-kind=unsupported]")
    assert page.locator("#answer a.cite.unsupported").count() == 1
    _shot(page, "unsupported")


def test_a_wrong_key_gets_a_clear_message(page: Any, page_server: PageServer) -> None:
    _ask(page, QUESTION, "rsk_not-a-key")
    page.wait_for_selector("#message:not([hidden])")
    message = page.inner_text("#message")
    assert "did not accept the key (401)" in message and "Enter a valid key" in message
    assert page.get_attribute("#answer", "data-state") == "failed"
    _shot(page, "wrong-key")


def test_the_page_measures_its_own_time_per_streamed_answer(page: Any, page_server: PageServer) -> None:
    """The page's own work per answer (chunks handled, last chunk to painted) over 20 answers, and
    its figures written beside the screenshots (BENCHMARKS.md, "The page")."""
    page_server.generator.words, page_server.generator.delay_s = SUPPORTED * 8, 0.0
    for n in range(20):
        _ask(page, f"{QUESTION} ({n})", page_server.keys["alice"])
        page.wait_for_function("(n) => window.ragservePage.answers.length === n", arg=n + 1)
        page.click("#forget")
    answers = page.evaluate("window.ragservePage.answers")
    handle = [a["handleMs"] for a in answers]
    settle = [a["settleMs"] for a in answers]
    figures = {
        "answers": len(answers),
        "chunks_per_answer": statistics.median(a["chunks"] for a in answers),
        "handle_ms_median": statistics.median(handle),
        "handle_ms_max": max(handle),
        "settle_ms_median": statistics.median(settle),
        "settle_ms_max": max(settle),
    }
    (output_folder() / "overhead.json").write_text(json.dumps(figures, indent=2) + "\n")
    assert figures["chunks_per_answer"] >= 70
    assert figures["handle_ms_median"] < 100  # generous: the point is the figure, written above
