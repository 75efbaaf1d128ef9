"""`localchat --selftest`: the installers' smoke test. It drives the real window like a user would (the
loading page, the sign-in, one chat message through the page), checks the answer rendered, deletes
that test chat (the user's history keeps nothing of it), closes the window and says what failed.

The page's CSP forbids eval, so scripts go in through `run_js` and report back by POSTing to
/desktop/report (same origin, signed in), never through `evaluate_js`.
"""

from __future__ import annotations

import json
import queue
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localchat.desktop.app import DesktopApp

LOAD_TIMEOUT_S = 240.0  # a first launch may fetch and load the default model
ANSWER_TIMEOUT_S = 120.0

_REPORT = "fetch('/desktop/report',{method:'POST',body:JSON.stringify(%s)});"
PROBE_JS = (
    "(function(){var i=document.getElementById('composer-input');"
    # app.js marks <html data-ready> once htmx has bound the forms; window.htmx alone exists earlier, when a
    # click on Send is still a plain form submit (a CI flake: "GET /?content=Hi!" and no answer).
    + _REPORT
    % "{kind:'probe',path:location.pathname,composer:!!i,ready:document.documentElement.dataset.ready}"
    + "})();"
)
SEND_JS = (
    "(function(){var i=document.getElementById('composer-input');i.value=%s;"
    "i.dispatchEvent(new Event('input',{bubbles:true}));document.getElementById('send-btn').click();})();"
)
ANSWER_JS = (
    "(function(){var all=document.querySelectorAll('#messages .msg.assistant');var m=all[all.length-1];"
    "var e=m&&m.querySelector('.msg-error');var a=m&&m.querySelector('.answer');"
    + _REPORT
    % "{kind:'answer',count:all.length,status:m?m.dataset.status:null,"
    "text:a?a.textContent:'',html:a?a.innerHTML.length:0,error:e?e.textContent.trim():null}" + "})();"
)

# The test chat is the selftest's, not the user's: delete it through the UI's own route (once per page).
CLEANUP_JS = (
    "(function(){if(window.__lcSelftestDeleted)return;window.__lcSelftestDeleted=1;"
    "var id=location.pathname.split('/').pop();"
    "fetch('/ui/c/'+id,{method:'DELETE',headers:{'HX-Request':'true'}}).then(function(r){"
    + _REPORT % "{kind:'deleted',status:r.status,path:location.pathname}"
    + "});})();"
)


ABOUT_JS = (
    "(function(){document.getElementById('about-open').click();setTimeout(function(){"
    "var d=document.getElementById('about');var b=document.getElementById('about-body');"
    + _REPORT % "{kind:'about',open:!!(d&&d.open),text:b?b.textContent:''}"
    + "},300);})();"
)


class SelfTest:
    def __init__(self, app: DesktopApp) -> None:
        self.app = app
        self.reports: queue.Queue[dict[str, Any]] = queue.Queue()
        self.timings: dict[str, float] = {}
        self.answer = ""

    def report(self, payload: dict[str, Any]) -> None:  # from the server thread
        self.reports.put(payload)

    def _elapsed(self) -> float:
        return time.monotonic() - self.app.started

    def _ask(self, script: str, done: Any, timeout_s: float, what: str) -> dict[str, Any]:
        """Run `script` every half second until a report satisfies `done`."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.app.gate.progress.status == "error":
                raise AssertionError(f"the model did not load: {self.app.gate.progress.detail}")
            self.app.window.run_js(script)
            try:
                while True:
                    last = self.reports.get(timeout=0.5)
                    if done(last):
                        return last
            except queue.Empty:
                pass
        raise AssertionError(f"{what} within {timeout_s:.0f}s (last seen: {json.dumps(last)[:300]})")

    def run(self) -> None:
        """Runs on pywebview's worker thread once the GUI loop is up; always closes the window."""
        app = self.app
        try:
            if not app.window.events.shown.wait(30):
                raise AssertionError("the window was not shown within 30s")
            self.timings["window"] = self._elapsed()
            self._ask(
                PROBE_JS,
                lambda r: r.get("composer") and r.get("ready") == "1",
                LOAD_TIMEOUT_S,
                "no chat UI",
            )
            self.timings["usable"] = self._elapsed()
            if not app.gate.loading_seen.is_set() and not app.gate.signed_in.is_set():
                raise AssertionError("the chat UI appeared without the loading page and the sign-in")
            app.window.run_js(SEND_JS % json.dumps(app.message))
            sent = time.monotonic()
            result = self._ask(
                ANSWER_JS,
                # "done" comes a moment before app.js renders the markdown: wait for the text too.
                lambda r: (
                    r.get("count")
                    and (
                        r.get("status") in ("error", "stopped")
                        or (r.get("status") == "done" and r.get("text"))
                    )
                ),
                ANSWER_TIMEOUT_S,
                "no finished, rendered answer",
            )
            if result.get("error") or result.get("status") != "done":
                raise AssertionError(f"the answer failed: {result.get('error') or result.get('status')}")
            if not str(result.get("text", "")).strip():
                raise AssertionError("the answer finished but nothing was rendered")
            self.answer = str(result["text"]).strip()
            self.timings["answer"] = time.monotonic() - sent
            about = self._ask(ABOUT_JS, lambda r: r.get("kind") == "about" and "Log file" in r.get("text", ""),
                              30, "no About dialog with the log file")  # fmt: skip
            if not about.get("open"):
                raise AssertionError("the About dialog did not open")
            deleted = self._ask(CLEANUP_JS, lambda r: r.get("kind") == "deleted", 30, "no clean-up")
            if deleted.get("status") != 200:
                raise AssertionError(f"deleting the test chat {deleted.get('path')} failed: {deleted}")
        except AssertionError as exc:
            app.failures.append(str(exc))
        except Exception as exc:
            app.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            app.window.destroy()

    def finish(self, server_stopped: bool) -> int:
        if not server_stopped:
            self.app.failures.append("the server did not stop after the window closed")
        if self.app.failures:
            for failure in self.app.failures:
                print(f"localchat --selftest failed: {failure}", file=sys.stderr, flush=True)
            return 1
        t = self.timings
        print(
            f"localchat --selftest passed: window after {t['window']:.2f}s, chat UI usable after "
            f"{t['usable']:.2f}s, answer rendered in {t['answer']:.2f}s on port {self.app.port}: "
            f"{self.answer[:80]!r}",
            flush=True,
        )
        return 0
