"""End to end in headless Debian Chromium: start the app as `streamlit run` on a free port with its
own data folder, run a small batch on the embedded SmolLM2 model, survive a refresh mid-run, open
its clusters, approve and apply a proposal, evolve with both strategies and compare them, download
the harness zip and have a hostile zip refused.

This covers what AppTest cannot drive: the polling fragments (progress bars that advance by
themselves), the browser's download and upload, and the real model. A screenshot of every page at
1280x800 lands in `test-artifacts/screenshots/` (kept by `.ci/run`).
"""

from __future__ import annotations

import contextlib

import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

playwright_api = pytest.importorskip("playwright.sync_api")
from playwright.sync_api import FilePayload, Page, expect, sync_playwright  # noqa: E402
from servers.proc_tree import stop  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# 6 instances rarely give a cluster big enough to be harness-level on one model; 12 reliably do.
BATCH = int(os.environ.get("ECDYSIS_E2E_BATCH", "12"))
BATCH_TIMEOUT_MS = 15 * 60 * 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"streamlit exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"streamlit did not become healthy:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def streamlit_app(home: Path, log: Path, **env_extra: str) -> Iterator[str]:
    """The app on a free port with `home` as its data folder, healthy; stopped on exit. Its
    output goes to `log`."""
    port = free_port()
    env = {**os.environ, "ECDYSIS_HOME": str(home), **env_extra,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("ECDYSIS_APP_PASSWORD", None)
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
                                 "--server.headless", "true"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        stop(proc, timeout_s=20)


@pytest.fixture
def app_url(tmp_path: Path, ecdysis_home: Path) -> Iterator[str]:
    log = tmp_path / "streamlit.log"
    # The walk checks the app's flow on the fastest embedded model; the default pair (Qwen 0.5B +
    # SmolLM2) is what the page offers (test_app_pages) and runs end to end in test_cli.
    with streamlit_app(ecdysis_home, log, ECDYSIS_MODELS="smollm2") as url:
        yield url
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]


@pytest.fixture
def page() -> Iterator[Page]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (scripts/setup.sh --system installs it)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
        tab = context.new_page()
        tab.set_default_timeout(60_000)
        try:
            yield tab
        finally:
            context.close()
            browser.close()


def settle(page: Page, quiet_s: float = 1.0, timeout_s: float = 60.0) -> None:
    """Wait until the script run is over (no 'running' indicator, no skeleton) for `quiet_s`."""
    deadline = time.time() + timeout_s
    quiet_since = None
    while time.time() < deadline:
        busy = page.locator('[data-testid="stStatusWidget"], [data-testid="stSkeleton"]').count() > 0
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.time()
        elif time.time() - quiet_since >= quiet_s:
            return
        time.sleep(0.2)


def shot(page: Page, name: str) -> None:
    settle(page)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def scroll_to(page: Page, text: str) -> None:
    page.get_by_text(text, exact=False).first.scroll_into_view_if_needed()
    time.sleep(0.5)


def goto(page: Page, url: str) -> None:
    page.goto(url)
    page.locator("h1").first.wait_for()
    settle(page)


def no_traceback(page: Page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, "a stack trace reached the page"


def run_batch(page: Page, url: str) -> None:
    goto(page, url)
    expect(page.get_by_text("No runs yet — start one with the embedded model.")).to_be_visible()
    shot(page, "01_runs_empty")
    page.get_by_role("spinbutton", name="Batch size").fill(str(BATCH))
    page.get_by_role("spinbutton", name="Concurrency").fill("2")
    page.get_by_role("button", name="Start batch").click()
    progress = page.locator('[data-testid="stProgress"]').first
    progress.wait_for(timeout=120_000)
    shot(page, "02_runs_progress")
    page.reload()  # the batch lives in the engine's worker and the store, not in this tab
    expect(page.locator('[data-testid="stProgress"]').first).to_contain_text("running", timeout=60_000)
    page.locator('[data-testid="stProgress"]').first.wait_for(state="detached", timeout=BATCH_TIMEOUT_MS)
    settle(page)
    no_traceback(page)
    expect(page.get_by_text("call 1 ·", exact=False).first).to_be_visible()
    shot(page, "03_runs_done")


def open_clusters(page: Page, url: str) -> None:
    page.get_by_role("button", name="Diagnose this run's failures").click()
    page.get_by_role("link", name="Watch it on Failure clusters").click()
    page.locator("h1", has_text="Failure clusters").wait_for()
    page.get_by_text("Cluster sizes by verdict").first.wait_for(timeout=180_000)
    settle(page)
    no_traceback(page)
    shot(page, "04_clusters")
    scroll_to(page, "Cluster × model")
    shot(page, "05_clusters_charts")
    scroll_to(page, "click a row for its trajectory")
    shot(page, "06_clusters_drilldown")
    goto(page, f"{url}/diagnoses")
    no_traceback(page)
    expect(page.get_by_text("Investigator").first).to_be_visible()
    shot(page, "07_diagnoses")


def approve_and_apply(page: Page, url: str) -> None:
    goto(page, f"{url}/review")
    no_traceback(page)
    approve = page.get_by_role("button", name="Approve")
    expect(approve).to_be_visible()
    shot(page, "08_review")
    scroll_to(page, "The patch")
    shot(page, "09_review_diff")
    approve.click()
    apply = page.get_by_role("button", name="Apply — create the next harness version")
    apply.wait_for()
    apply.click()
    page.get_by_text("Applied as harness version").wait_for()
    settle(page)
    no_traceback(page)
    shot(page, "10_review_applied")


def wait_until_no_progress(page: Page, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while page.locator('[data-testid="stProgress"]').count():
        assert time.time() < deadline, "background work did not finish"
        time.sleep(1.0)
    settle(page)


def evolve_both_strategies(page: Page, url: str) -> None:
    """One auto-approved iteration of each strategy, watched live, then compared in numbers."""
    goto(page, f"{url}/evolution")
    expect(page.get_by_text("No evolution yet.")).to_be_visible()
    page.get_by_text("both, side by side", exact=True).click()
    page.get_by_text("auto-approve", exact=True).click()
    for label, value in (("Iterations", 1), ("Train batch", 4), ("Validation", 4), ("Test", 4), ("Concurrency", 2)):
        page.get_by_role("spinbutton", name=label).fill(str(value))
    page.get_by_role("button", name="Start evolution").click()
    page.locator('[data-testid="stProgress"]').first.wait_for(timeout=60_000)
    shot(page, "11_evolution_running")
    wait_until_no_progress(page, BATCH_TIMEOUT_MS / 1000)
    no_traceback(page)
    expect(page.get_by_text("status done", exact=False).first).to_be_visible(timeout=60_000)
    shot(page, "12_evolution_watch")
    page.get_by_role("tab", name="Compare strategies").click()
    expect(page.get_by_text("Training time: ecdysis", exact=False)).to_be_visible()
    expect(page.get_by_text("percentage points", exact=False)).to_be_visible()
    shot(page, "13_evolution_compare")


def download_and_import(page: Page, url: str, tmp_path: Path) -> None:
    goto(page, f"{url}/harnesses")
    no_traceback(page)
    expect(page.locator('[data-testid="stGraphVizChart"]')).to_be_visible()
    shot(page, "14_harnesses")
    with page.expect_download() as info:
        page.get_by_role("button", name="Download zip").click()
    target = tmp_path / info.value.suggested_filename
    info.value.save_as(target)
    names = zipfile.ZipFile(target).namelist()
    assert "manifest.json" in names and "run.py" in names and any(n.startswith("harness/") for n in names)
    hostile = io.BytesIO()
    with zipfile.ZipFile(hostile, "w") as zf:
        zf.writestr("../../outside.py", "print('escaped')")
    payload = FilePayload(name="hostile.zip", mimeType="application/zip", buffer=hostile.getvalue())
    page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(files=[payload])
    page.get_by_text("hostile.zip was refused").wait_for()
    no_traceback(page)
    scroll_to(page, "hostile.zip was refused")
    shot(page, "15_harnesses_import_refused")


def test_batch_clusters_review_and_export_in_the_browser(app_url: str, page: Page, tmp_path: Path) -> None:
    run_batch(page, app_url)
    open_clusters(page, app_url)
    approve_and_apply(page, app_url)
    evolve_both_strategies(page, app_url)
    download_and_import(page, app_url, tmp_path)
