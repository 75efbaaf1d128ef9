"""Icons come from the inline SVG sprite, never from a font's glyph (U+24D8 was a blank box where no
installed font had it): every button's own text is ASCII, and every `<use>` draws a symbol that exists."""

from __future__ import annotations

from typing import Any

import pytest

from tests.ui.actions import send_new_chat, wait_answer

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser

# Buttons and button-like links whose text is not pure ASCII (a glyph standing in for an icon).
GLYPH_BUTTONS = """() => Array.from(document.querySelectorAll('button, .btn, .icon-btn, .act, summary'))
  .filter(el => /[^\\x00-\\x7F]/.test(el.textContent))
  .map(el => el.outerHTML.slice(0, 120))"""

# `<use>` elements whose target is missing, not a symbol, or draws nothing.
BROKEN_USES = """() => Array.from(document.querySelectorAll('use')).filter(use => {
    const id = (use.getAttribute('href') || '').replace(/^#/, '');
    const target = document.getElementById(id);
    if (!target || target.tagName.toLowerCase() !== 'symbol') return true;
    const box = use.getBBox();
    return use.getClientRects().length > 0 && (box.width === 0 || box.height === 0);
  }).map(use => use.getAttribute('href'))"""


def _check(page: Any) -> int:
    assert page.evaluate(GLYPH_BUTTONS) == []
    assert page.evaluate(BROKEN_USES) == []
    return int(page.locator("svg.icon use").count())


def test_icons_are_svg_symbols_not_glyphs(page: Any, live: Any) -> None:
    send_new_chat(page, "Hello icons")
    wait_answer(page)
    assert _check(page) >= 8  # sidebar, topbar, conversation tools
    about = page.locator("#about-open svg.icon")
    box = about.bounding_box()
    assert box and box["width"] >= 12 and box["height"] >= 12, "the About icon is drawn"
    page.locator(".conv-item.current").hover()
    page.locator(".conv-item.current [aria-label^=Rename]").click()
    expect(page.locator(".rename-form")).to_be_visible()
    _check(page)
    page.goto("/ui/models")
    assert _check(page) >= 1
