"""Model output and user text that try to run script: nothing runs, and the text shows as written."""

from __future__ import annotations

from typing import Any

import pytest

from tests.ui.actions import send_new_chat, wait_answer

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser

# Each attack sets window.__xss if it ever runs. (No ">>" inside: that would end the fake's script.)
ATTACKS = [
    '<img src=x onerror="window.__xss=1">',
    "<script>window.__xss=2</script>",
    "[click me](javascript:window.__xss=3)",
    '<a href="javascript:window.__xss=4">raw link</a>',
    '<svg onload="window.__xss=5"></svg>',
    '<iframe src="javascript:window.__xss=6"></iframe>',
    "![pic](javascript:window.__xss=7)",
    '<details open ontoggle="window.__xss=8">x</details>',
]
REPLY = "**bold** and `<b>code</b>`\\n\\n" + "\\n\\n".join(ATTACKS) + "\\n\\n<div>raw *html* block</div> end"
# What the browser shows: raw HTML in markdown is displayed as text, never interpreted.
SHOWN_AS_TEXT = [
    '<img src=x onerror="window.__xss=1">',
    "<script>window.__xss=2</script>",
    '<a href="javascript:window.__xss=4">raw link</a>',
    '<svg onload="window.__xss=5"></svg>',
    '<details open ontoggle="window.__xss=8">x</details>',
]

DANGEROUS_DOM = """() => {
  const bad = [];
  for (const el of document.querySelectorAll('#messages *, #conv-list *, #chat-title')) {
    if (['SCRIPT', 'IFRAME', 'OBJECT', 'EMBED'].includes(el.tagName)) bad.push(el.outerHTML);
    if (el.tagName === 'svg' && el.closest('#messages')) bad.push(el.outerHTML);
    for (const attr of el.attributes) {
      if (attr.name.startsWith('on') || /^\\s*javascript:/i.test(attr.value)) bad.push(el.outerHTML.slice(0, 200));
    }
  }
  return bad;
}"""


def _check_page(page: Any) -> None:
    answer = page.locator("#messages .msg.assistant .answer")
    for text in SHOWN_AS_TEXT:
        expect(answer).to_contain_text(text)
    expect(answer.locator("strong")).to_have_text("bold")  # markdown still works
    expect(answer.locator("code").first).to_have_text("<b>code</b>")
    expect(answer).to_contain_text("<div>raw *html* block</div>")
    expect(page.locator("#messages .msg.user .text")).to_contain_text('<img src=x onerror="window.__xss=1">')
    links = answer.locator("a")
    for i in range(links.count()):
        href = links.nth(i).get_attribute("href")
        assert href is None or not href.lower().startswith("javascript"), href
    if links.count():
        links.first.click()  # a sanitized link does nothing
    assert page.evaluate("() => typeof window.__xss") == "undefined"
    assert page.evaluate(DANGEROUS_DOM) == []


def test_model_output_cannot_run_script(page: Any, live: Any) -> None:
    first_line = '<img src=x onerror="window.__xss=9"> title'
    send_new_chat(page, f"{first_line}\n<<slow:2>><<say:{REPLY}>>")
    wait_answer(page)  # streamed: rendered many times from partial markup on the way
    _check_page(page)
    assert page.title().startswith(first_line)  # the auto-title is text, in <title> and the sidebar
    expect(page.locator("#conv-list .current .conv-link")).to_have_text(first_line)
    page.reload()  # server-rendered this time
    wait_answer(page)
    _check_page(page)
    page.wait_for_timeout(300)  # any late onerror/onload would have fired by now
    assert page.evaluate("() => typeof window.__xss") == "undefined"
