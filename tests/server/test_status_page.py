"""The status page in a real headless Chromium (Debian's ``chromium``, driven by
Playwright over CDP; no browser is downloaded) against a real server on the starter model:
it loads with no console errors, names the real model, follows a request, and its chat box
answers. The key flow and a request held in the queue run against an in-process server on
a stand-in engine (a real uvicorn on loopback; only the engine is scripted). Each test saves a screenshot under its tmp dir and, when
``MLX_KIT_SCREENSHOT_DIR`` is set, copies it there (the path is printed).

Skipped with the reason when Chromium or Playwright is missing; in CI (``CI`` set, or
``MLX_KIT_REQUIRE_AGENTS=1``) a missing one fails instead: .ci/run installs both.
"""

from __future__ import annotations

import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, wait_until
from tests.server.test_metrics import StandInEngine, make_app

try:  # the assertions that wait (they run no script in the page: its CSP forbids eval)
    from playwright.sync_api import expect
except ImportError:  # skipped (or failed in CI) by the chromium_path fixture
    expect = None

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 60_000


def _required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("MLX_KIT_REQUIRE_AGENTS") == "1"


def _missing(what: str) -> None:
    if _required():
        pytest.fail(f"{what} is missing but CI / MLX_KIT_REQUIRE_AGENTS=1 requires it "
                    "(.ci/run installs it)")
    pytest.skip(f"{what} is not installed (apt-get install chromium; pip install playwright)")


@pytest.fixture(scope="module")
def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _missing("Debian's chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the playwright package")
    return path


@pytest.fixture
def browser(chromium_path, tmp_path):
    """A fresh Chromium profile (its own --user-data-dir) and one page; yields
    ``(page, problems)``: console errors and uncaught exceptions as they happen."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium_path, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 1000})
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        problems: list[str] = []
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        try:
            yield page, problems
        finally:
            context.close()


def screenshot(page, tmp_path: Path, name: str) -> Path:
    """Save the page as ``name``.png under ``tmp_path`` and in MLX_KIT_SCREENSHOT_DIR when
    set; print where."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    where = [path]
    target = os.environ.get("MLX_KIT_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        where.append(Path(shutil.copy(path, Path(target) / path.name)))
    print(f"status page screenshot: {' and '.join(map(str, where))}")
    return path


def test_page_loads_clean_names_the_model_and_follows_a_request(server, browser, tmp_path):
    page, problems = browser
    model = server.health()["model"]
    page.goto(server.root + "/")  # a browser's GET / is sent to /ui
    assert page.url == server.root + "/ui"
    expect(page.locator("#model")).to_have_text(model, timeout=TIMEOUT_MS)
    expect(page.locator("#state")).to_have_text("ready")
    assert model in page.text_content("#models")
    served = int(page.text_content("#served"))
    generated = int(page.text_content("#generated-tokens"))

    r = httpx.post(server.v1 + "/chat/completions", timeout=120,
                   headers={"user-agent": "opencode/1.18.33"},
                   json={"model": "local", "max_tokens": 8,
                         "messages": [{"role": "user", "content": "Count to three"}]})
    assert r.status_code == 200
    # the engine's count can reach a poll before the HTTP process ended the request: wait
    # for each number rather than read them all after the first changed
    expect(page.locator("#served")).to_have_text(str(served + 1), timeout=TIMEOUT_MS)
    expect(page.locator("#generated-tokens")).to_have_text(
        str(generated + r.json()["usage"]["completion_tokens"]), timeout=TIMEOUT_MS)
    page.wait_for_selector("#chart-tps circle, #chart-ttft circle")  # the run was plotted
    screenshot(page, tmp_path, "status-page")
    assert problems == []


def test_chat_box_streams_an_answer_from_local(server, browser, tmp_path):
    page, problems = browser
    page.goto(server.root + "/ui")
    expect(page.locator("#state")).to_have_text("ready", timeout=TIMEOUT_MS)
    before = server.health()["requests_served"]
    page.fill("#prompt", "Say hello")
    page.click("#send")
    answer = page.wait_for_selector(".msg.assistant[data-done='1']")
    text = answer.text_content()
    assert text.strip() and not text.startswith("error:")
    assert server.health()["requests_served"] == before + 1
    expect(page.locator("#served")).to_have_text(str(before + 1), timeout=TIMEOUT_MS)
    expect(page.locator("#live-empty")).to_be_visible(timeout=TIMEOUT_MS)  # it ended
    screenshot(page, tmp_path, "status-page-chat")
    assert problems == []


@contextmanager
def in_process_server(engine: StandInEngine, log_level: str = "warning", **state):
    """uvicorn on loopback in a thread, serving :func:`make_app` on ``engine`` (the
    stand-in: the page's key flow and its live list are the server's and the page's code,
    and a held request needs an engine that can be held); ``log_level`` "info" keeps
    uvicorn's access log."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(make_app(engine, port=port, **state), host="127.0.0.1",
                            port=port, log_level=log_level, lifespan="off")
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    root = f"http://127.0.0.1:{port}"
    wait_until(lambda: web.started, timeout=30)
    try:
        yield root
    finally:
        web.should_exit = True
        thread.join(10)


def test_a_held_request_shows_live_with_its_agent_then_leaves(browser, tmp_path):
    page, problems = browser
    engine = StandInEngine(words=3)
    engine.gate = threading.Event()
    with in_process_server(engine) as root:
        page.goto(root + "/ui")
        expect(page.locator("#model")).to_have_text("stand-in/model", timeout=TIMEOUT_MS)
        expect(page.locator("#live-empty")).to_be_visible()
        held = threading.Thread(target=lambda: httpx.post(
            root + "/v1/messages", timeout=60, headers={"user-agent": "claude-cli/2.1.332"},
            json={"model": "local", "max_tokens": 8,
                  "messages": [{"role": "user", "content": "hi"}]}))
        held.start()
        row = page.locator("#live tbody tr")
        expect(row).to_have_count(1, timeout=TIMEOUT_MS)
        cells = row.locator("td").all_text_contents()
        assert cells[1:5] == ["anthropic", "Claude Code", "stand-in/model", "queued"]
        screenshot(page, tmp_path, "status-page-live")
        engine.gate.set()
        held.join(60)
        expect(row).to_have_count(0, timeout=TIMEOUT_MS)
        expect(page.locator("#generated-tokens")).to_have_text("3")
    assert problems == []


def test_with_an_api_key_the_page_asks_for_it_and_then_shows_the_server(browser, tmp_path):
    page, problems = browser
    with in_process_server(StandInEngine(), api_key="ui-key") as root:
        page.goto(root + "/ui")
        page.wait_for_selector("#keyform:not([hidden])")
        expect(page.locator("#model")).not_to_have_text("stand-in/model")
        page.fill("#key", "ui-key")
        page.click("#keyform button")
        expect(page.locator("#model")).to_have_text("stand-in/model", timeout=TIMEOUT_MS)
        assert page.is_hidden("#keyform")
        assert page.evaluate("sessionStorage.getItem('mlx-kit-api-key')") == "ui-key"
        assert page.evaluate("document.cookie") == ""
        page.fill("#prompt", "hi")
        page.click("#send")  # the chat carries the key too
        answer = page.wait_for_selector(".msg.assistant[data-done='1']")
        assert answer.text_content() == "w0 w1 w2 w3 "
        screenshot(page, tmp_path, "status-page-key")
    # the refused polls before the key was given: Chromium logs each failed fetch
    assert [p for p in problems if "401" not in p] == []


def test_page_files_load_nothing_from_elsewhere():
    """Offline and no CDN: no URL in the page's files leaves this server (the SVG
    namespace is a name, not a fetch), and no inline script the CSP would refuse."""
    import re

    from kit.server.ui import FILES, STATIC

    for name in ["ui.html", *FILES]:
        text = (STATIC / name).read_text()
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"')]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)
        assert "@import" not in text
    html = (STATIC / "ui.html").read_text()
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/ui/static/ui.js" defer>']
    assert not re.search(r"\s(?:style|on\w+)=", html)  # inline styles and handlers
