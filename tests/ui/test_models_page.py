"""The Models page and the model picker in a real browser (Debian's chromium), against the app served
live with the fake Hugging Face hub: the download progress bar moves, Cancel keeps the partial, Resume
finishes it, Load and "Use in chat" switch the chat to the new model, and each answer records its
model. A first start with no model on disk offers the default model, downloads and loads it (torch)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf
from tests.ui.conftest import PageErrors, new_page
from tests.ui.web_app import LiveApp, live_app

pytestmark = pytest.mark.browser
BIG_SIZE = 6 << 20  # the hub's download reads 1 MiB chunks: progress and Cancel land between them


def tiny_gguf(folder: Path) -> bytes:
    cfg = tiny_config()
    return write_tiny_gguf(folder / "t.gguf", random_state_dict(cfg), cfg, qtype="Q4_0").read_bytes()


def user_catalog(home: Path, alias: str, repo: str, file: str, size: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.yaml").write_text(
        f"models:\n  {alias}:\n    description: A tiny random model for tests\n    repo_id: {repo}\n"
        f"    file: {file}\n    format: gguf\n    size: {size}\n    context_length: 2048\n"
        f"    license: MIT\n    sources:\n      - hf: {repo}\n        file: {file}\n"
    )


@pytest.fixture
def models_app(fake_hub: Any, tmp_path: Path) -> Iterator[LiveApp]:
    data = tiny_gguf(tmp_path)
    data += b"\0" * (BIG_SIZE - len(data))
    fake_hub.add_repo("org/tiny-GGUF", {"tiny-Q4_0.gguf": data})
    user_catalog(tmp_path / "home", "tiny-test", "org/tiny-GGUF", "tiny-Q4_0.gguf", len(data))
    with live_app(tmp_path / "home") as app:
        yield app


def progress_value(page: Any) -> float:
    return float(page.locator("#cat-tiny-test progress").get_attribute("value") or 0)


def test_download_cancel_resume_load_and_chat(browser: Any, models_app: LiveApp, fake_hub: Any) -> None:
    from tests.helpers.fake_hub import Fault

    fake_hub.faults["tiny-Q4_0.gguf"] = Fault(throttle_bps=1 << 20)
    errors = PageErrors()
    page = new_page(browser, models_app, errors)
    page.goto("/")
    page.click("#models-link")
    row = page.locator("#cat-tiny-test")
    assert "A tiny random model" in row.inner_text() and "MIT" in row.inner_text()
    assert "fits your RAM" in row.inner_text()

    page.fill("#catalog-search", "no such model at all")
    page.locator("#catalog-rows", has_text="No catalog model matches.").wait_for()
    page.fill("#catalog-search", "tiny")
    row.wait_for()

    row.get_by_role("button", name="Download tiny-test").click()
    page.wait_for_function("() => Number(document.querySelector('#cat-tiny-test progress')?.value || 0) > 10")
    first = progress_value(page)
    page.wait_for_function(
        f"() => Number(document.querySelector('#cat-tiny-test progress')?.value || 0) > {first}"
    )
    assert "B/s · " in row.inner_text() and " s left" in row.inner_text()  # speed and ETA

    row.get_by_role("button", name="Cancel tiny-test").click()
    row.locator("[data-phase=cancelled]").wait_for()
    assert "partial download is kept" in row.inner_text()
    fake_hub.faults.clear()
    row.get_by_role("button", name="Resume tiny-test").click()
    row.locator("[data-phase=done]").wait_for(timeout=30_000)
    starts = [r.range_start for r in fake_hub.requests("cdn") if r.method == "GET"]
    assert starts[-1] and starts[-1] > 0  # resumed, not started over

    local = page.locator("#local-models .local-model[data-name='tiny-test']")
    local.wait_for()  # the finished download refreshed the local list
    row.get_by_role("button", name="Load tiny-test").click()
    page.locator("#model-status", has_text="tiny-test is loaded").wait_for()
    page.reload()
    assert "Loaded" in local.inner_text()

    local.get_by_role("link", name="Use in chat").click()
    assert page.locator("#model-select").input_value() == "tiny-test"
    page.fill("#composer-input", "<<say:hello from the tiny model>>")
    page.click("#send-btn")
    answer = page.locator(".msg.assistant[data-status=done]").last
    answer.wait_for(timeout=20_000)
    answer.locator(".answer", has_text="hello from the tiny model").wait_for()  # markdown renders in JS
    assert answer.locator(".stat-model").inner_text() == "tiny-test"
    assert not errors.errors, errors.errors


def test_picker_switches_the_conversation_model(browser: Any, models_app: LiveApp) -> None:
    from localchat import hub

    hub.pull("tiny-test")
    errors = PageErrors()
    page = new_page(browser, models_app, errors)
    page.goto("/")
    page.fill("#composer-input", "<<say:first answer>>")
    page.click("#send-btn")
    page.wait_for_url("**/c/*")
    first = page.locator(".msg.assistant[data-status=done]").first
    first.wait_for()
    assert first.locator(".stat-model").inner_text() == "fake-model"

    page.select_option("#model-select", "tiny-test")
    page.locator("#model-status", has_text="tiny-test is loaded").wait_for()
    page.fill("#composer-input", "again")  # (the fake model repeats the first <<say:>> of the prompt)
    page.click("#send-btn")
    second = page.locator(".msg.assistant[data-status=done]").nth(1)
    second.wait_for()
    assert second.locator(".stat-model").inner_text() == "tiny-test"
    page.reload()  # the conversation keeps its model, and each answer the one that wrote it
    assert page.locator("#model-select").input_value() == "tiny-test"
    assert page.locator(".stat-model").all_inner_texts() == ["fake-model", "tiny-test"]
    assert not errors.errors, errors.errors


@pytest.mark.slow
def test_first_start_offers_the_default_model(browser: Any, fake_hub: Any, tmp_path: Path) -> None:
    from tests.helpers.live_server import real_backend_missing

    if why := real_backend_missing():
        pytest.skip(why)
    data = tiny_gguf(tmp_path)
    fake_hub.add_repo("org/tiny-GGUF", {"tiny-Q4_0.gguf": data})
    # The packaged default, pointed at the fake hub (a user models.yaml entry overrides it).
    user_catalog(tmp_path / "home", "smollm2-135m", "org/tiny-GGUF", "tiny-Q4_0.gguf", len(data))
    with live_app(tmp_path / "home", preload=False, backend="torch", dtype="float32") as app:
        errors = PageErrors()
        page = new_page(browser, app, errors)
        page.goto("/")
        status = page.locator("#model-status")
        assert "No model is on this machine yet" in status.inner_text()
        page.click("#get-started")
        # Downloads, loads (real torch weights), then the page draws itself again with the model.
        page.locator("#model-select option[value='smollm2-135m']").wait_for(state="attached", timeout=60_000)
        assert page.locator("#model-select").input_value() == "smollm2-135m"
        page.fill("#composer-input", "Hi")
        page.click("#send-btn")
        answer = page.locator(".msg.assistant[data-status=done]").first
        answer.wait_for(timeout=60_000)
        assert answer.locator(".stat-model").inner_text() == "smollm2-135m"
        assert not errors.errors, errors.errors
