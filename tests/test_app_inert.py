"""Untrusted text is inert on every page: what a model replied, what a harness raised, a call's
or a job's error, a reviewer's reason and an imported suite's names show as text, never as a link,
an image or HTML, and the app needs nothing from another host (not even its page icon).

The world (`hostile_world.py`) fills every such field with Markdown and HTML pointing at a bait
server on 127.0.0.2. AppTest checks what each page hands to Streamlit's Markdown; Chromium renders
the real pages and fails on any request to a host other than the app's, on any link or image that
points elsewhere, and on any hit at the bait server.
"""

from __future__ import annotations

import http.server
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest
from streamlit.testing.v1 import AppTest

import hostile_world
from app.text import WORD_JOINER, md

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "app" / "main.py"
PAGES = ["1_runs", "2_clusters", "3_diagnoses", "4_review", "5_evolution", "6_harnesses"]
# What Streamlit's Markdown would turn into something live, as it appears in the payload.
LIVE_MARKUP = ["](http", "<img", "<a ", "://", "www.", "@example.org", ":material/home:", ":red[red]", "&lt;"]


def live_markup(markdown: str) -> list[str]:
    """The markup of `LIVE_MARKUP` left in `markdown` once its backslash-escaped characters and
    its code spans (`app.text.code`: no backtick inside), which Markdown shows literally, are set
    aside."""
    bare = re.sub(r"`[^`]*`", "", re.sub(r"\\.", "", markdown, flags=re.S))
    return [live for live in LIVE_MARKUP if live in bare]


class Bait:
    """An HTTP server on another loopback address that records every request it gets."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.hits = hits
        self.server = http.server.ThreadingHTTPServer((hostile_world.BAIT_HOST, 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bait() -> Iterator[Bait]:
    server = Bait()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def world(ecdysis_home: Path, bait: Bait) -> hostile_world.HostileWorld:
    from ecdysis.service import Service
    from storage import open_store
    svc = Service(open_store())
    try:
        return hostile_world.build(svc, bait.port)
    finally:
        svc.store.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the escaping itself

def test_md_leaves_no_markup_and_keeps_every_character() -> None:
    text = hostile_world.payload(8999, "unit") + "\nline two  # not a heading\n1. not a list"
    out = md(text)
    assert live_markup(text) == LIVE_MARKUP, "the payload has every kind of markup"
    assert live_markup(out) == []
    assert not re.search(r"[!-/:-@\[-`{-~]", re.sub(r"\\[!-/:-@\[-`{-~]", "", out)), "an unescaped punctuation mark"
    seen = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", out).replace(WORD_JOINER, "").replace("  \n", "\n")
    assert seen == text


# ---------------------------------------------------------------- AppTest: what reaches Markdown

def _markdown_bodies(at: AppTest) -> list[str]:
    """Every string of the page that Streamlit renders as Markdown."""
    bodies: list[str] = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "toast"):
        bodies += [str(e.value) for e in at.get(kind)]
    for kind in ("expander", "button", "metric", "tab", "selectbox", "multiselect", "text_area"):
        bodies += [str(getattr(e, "label", "") or "") for e in at.get(kind)]
        bodies += [str(getattr(e, "help", "") or "") for e in at.get(kind)]
    bodies += [str(getattr(e.proto, "text", "")) for e in at.get("progress")]
    return bodies


def _page(name: str, **state: Any) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    at.switch_page(f"../pages/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("page", PAGES)
def test_every_page_hands_untrusted_text_to_markdown_inert(world: hostile_world.HostileWorld, page: str) -> None:
    at = _page(page)
    leaks = [(live_markup(b), b) for b in _markdown_bodies(at) if live_markup(b)]
    assert not leaks, leaks[:3]


def test_the_hostile_text_is_still_shown_as_text(world: hostile_world.HostileWorld) -> None:
    """Not vacuous: the Runs page does show the reply and the harness's error, as plain text."""
    at = _page("1_runs")
    plain = "\n".join(str(t.value) for t in at.text)
    assert "http://127.0.0.2" in plain and "/reply/md.png" in plain, "the model's reply is shown verbatim"
    errors = [re.sub(r"\\(.)", r"\1", str(e.value)).replace(WORD_JOINER, "") for e in at.error]
    assert any("/harness-error/md.png" in e for e in errors), errors


def test_review_shows_a_hostile_reason_inert(world: hostile_world.HostileWorld) -> None:
    at = _page("4_review", **{"review:filter": "rejected"})
    bodies = _markdown_bodies(at)
    assert any("reason" in b and "md\\.png" in b for b in bodies), "the rejection's reason is on the page"
    assert not [b for b in bodies if live_markup(b)]


# ---------------------------------------------------------------- Chromium: the real rendering

def _external(url: str, app_netloc: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "about", "javascript", ""):
        return parts.scheme == "javascript"
    return parts.netloc != app_netloc


@pytest.mark.slow
def test_no_page_makes_the_browser_reach_another_host(world: hostile_world.HostileWorld, bait: Bait,
                                                      ecdysis_home: Path, tmp_path: Path) -> None:
    pytest.importorskip("playwright.sync_api")
    from playwright.sync_api import sync_playwright
    from test_app_e2e import CHROMIUM, CHROMIUM_ARGS, settle, streamlit_app
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (scripts/setup.sh --system installs it)")
    requested: list[str] = []
    offsite: dict[str, list[str]] = {}
    with streamlit_app(ecdysis_home, tmp_path / "streamlit.log") as url:
        app = url.removeprefix("http://")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 1600})
            context.on("request", lambda r: requested.append(r.url))
            tab = context.new_page()
            tab.set_default_timeout(60_000)
            for path in ("runs", "clusters", "diagnoses", "review", "evolution", "harnesses"):
                tab.goto(f"http://{app}/{path}")
                tab.locator("h1").first.wait_for()
                settle(tab, quiet_s=1.5)
                assert tab.locator('[data-testid="stException"]').count() == 0, f"a traceback on {path}"
                urls = tab.evaluate("""() => Array.from(document.querySelectorAll('[href],[src],[srcset]'))
                    .flatMap(e => ['href', 'src', 'srcset', 'xlink:href'].map(a => e.getAttribute(a)))
                    .filter(Boolean).map(u => { try { return new URL(u, document.baseURI).href } catch { return u } })""")
                bad = [u for u in urls if _external(u, app)]
                if bad:
                    offsite[path] = bad
            tab.goto(f"http://{app}/runs")
            tab.locator("h1").first.wait_for()
            settle(tab, quiet_s=1.5)
            body = tab.inner_text("body")
            context.close()
            browser.close()
    assert not offsite, offsite
    assert not [u for u in requested if _external(u, app)], [u for u in requested if _external(u, app)][:5]
    assert not bait.hits, bait.hits
    assert "/harness-error/md.png" in body.replace(WORD_JOINER, ""), "the harness error is shown, as text"
