"""Searching the Hugging Face hub from the Models page, against the fake hub (never the real one):
matching GGUF repos, a repo's card (licence, quantizations with sizes, split parts summed), and a
Download of one quantization through the same pulls as the catalog's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localchat.hub.search import model_card, quant_of, search_models
from tests.ui.conftest import SCREENSHOTS, PageErrors, new_page
from tests.ui.web_app import LiveApp, live_app

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser


def _repos(fake_hub: Any) -> None:
    big = fake_hub.add_repo(
        "someorg/Tiny-Chat-GGUF",
        {"tiny-chat-Q4_K_M.gguf": b"G" * 3_000, "tiny-chat-Q8_0.gguf": b"G" * 5_000, "README.md": b"# hi"},
    )
    big.license, big.downloads = "mit", 900
    split = fake_hub.add_repo(
        "other/tiny-chat-big-GGUF",
        {"q6/tiny-Q6_K-00001-of-00002.gguf": b"G" * 2_000, "q6/tiny-Q6_K-00002-of-00002.gguf": b"G" * 2_500},
    )
    split.downloads = 10
    fake_hub.add_repo("someorg/unrelated", {"x.gguf": b"G"})


def test_search_and_card_read_the_hub_api(fake_hub: Any) -> None:
    _repos(fake_hub)
    found = search_models("tiny-chat")
    assert [(m.repo_id, m.license) for m in found] == [
        ("someorg/Tiny-Chat-GGUF", "mit"),
        ("other/tiny-chat-big-GGUF", "apache-2.0"),
    ]
    card = model_card("someorg/Tiny-Chat-GGUF")
    assert card.license == "mit" and [(q.quant, q.size_bytes) for q in card.quants] == [
        ("Q4_K_M", 3_000),
        ("Q8_0", 5_000),
    ]
    split = model_card("other/tiny-chat-big-GGUF")
    assert [(q.quant, len(q.files), q.size_bytes) for q in split.quants] == [("Q6_K", 2, 4_500)]
    assert [quant_of(n) for n in ("a-IQ3_XS.gguf", "b.f16.gguf", "c-Q5_K_S-00001-of-00003.gguf")] == [
        "IQ3_XS",
        "F16",
        "Q5_K_S",
    ]
    assert any(r.path.rstrip("/") == "/api/models" for r in fake_hub.requests("hub"))


@pytest.fixture
def hub_app(fake_hub: Any, tmp_path: Path) -> Iterator[LiveApp]:
    _repos(fake_hub)
    with live_app(tmp_path / "home") as app:
        yield app


def test_models_page_searches_the_hub_and_downloads_a_quant(browser: Any, hub_app: LiveApp) -> None:
    errors = PageErrors()
    page = new_page(browser, hub_app, errors)
    page.goto("/ui/models")
    page.fill("#hub-search", "tiny-chat")
    rows = page.locator("#hub-rows .hub-model")
    expect(rows).to_have_count(2)
    first = rows.first
    expect(first).to_contain_text("someorg/Tiny-Chat-GGUF")
    expect(first).to_contain_text("mit")
    first.get_by_role("button", name="Details of someorg/Tiny-Chat-GGUF").click()
    quants = first.locator(".hub-quant")
    expect(quants).to_have_count(2)
    expect(quants.first).to_contain_text("Q4_K_M")
    expect(quants.first).to_contain_text("3.0 KB")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "models-hub-card-wide.png"), full_page=True)
    quants.first.get_by_role("button", name="Download someorg/Tiny-Chat-GGUF:Q4_K_M").click()
    expect(quants.first.locator(".pull-done")).to_have_text("Downloaded.", timeout=20_000)
    page.fill("#hub-search", "nothing-like-this")
    expect(page.locator("#hub-rows")).to_contain_text("No GGUF model on the hub matches")
    page.context.close()
    assert not errors.errors, errors.errors
