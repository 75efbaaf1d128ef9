"""One smoke test of the UI on the real SmolLM2-135M (torch backend, CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.ui.actions import wait_answer
from tests.ui.conftest import new_page
from tests.ui.web_app import live_app

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _torch_backend_missing() -> bool:
    try:
        return importlib.util.find_spec("localchat.backends.torch.runner") is None
    except ImportError:
        return True


@pytest.mark.skipif(
    _torch_backend_missing(),
    reason="localchat.backends.torch.runner cannot be imported (torch backend missing)",
)
def test_real_smollm2_answers_in_the_browser(
    browser: Any, smollm2_gguf: Path, tmp_path: Path, page_errors: Any
) -> None:
    with live_app(
        tmp_path, backend="torch", file=str(smollm2_gguf), kv_cache_mib=64, max_model_len=2048
    ) as live:
        page = new_page(browser, live, page_errors)
        page.goto("/")
        expect(page.locator("#model-select option:checked")).to_contain_text("SmolLM2")
        page.click("#settings-open")
        page.fill("#set-max-tokens", "24")
        page.fill("#set-temperature", "0")
        page.keyboard.press("Escape")
        conv_id = send_new_chat_keeping(page, "What is the capital of France? Answer in one sentence.")
        answer = wait_answer(page, timeout_ms=120_000)
        text = answer.locator(".answer").inner_text()
        assert text.strip(), "the real model answered nothing"
        expect(answer.locator(".stat-tokens")).to_contain_text("tokens")
        stored = live.web.store.get_messages(conv_id)[1]
        assert stored.status == "done" and 0 < stored.completion_tokens <= 24 and "Paris" in stored.content
        page.context.close()
    assert not page_errors.errors, page_errors.errors


def send_new_chat_keeping(page: Any, text: str) -> str:
    """Send from the current new-chat page, keeping the settings typed into the dialog."""
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")
    page.wait_for_url("**/c/*")
    return page.url.rsplit("/", 1)[1]
