"""The web extension (web/stepcache.js) in the real ComfyUI frontend, driven by headless Chromium.

The real server serves the frontend package and this pack's web/ folder; the browser loads an
example API workflow, queues it from the page, and the panels the extension draws are compared
with what the server itself reports for that prompt (GET /stepcache/stats).

Needs playwright (in the host lock) and a system Chromium (Debian's `chromium`; playwright's own
browser download is not reachable from CI). Without them the test is skipped on a developer
machine and fails under CI or STEPCACHE_REQUIRE_BROWSER=1. Deselect with `-m "not browser"`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import urllib.request

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.timeout(180)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / "example_workflows" / "api"
# Screenshots are also kept here (git-ignored) so they can be looked at after a run.
OUT_DIR = REPO_ROOT / "out" / "browser"
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]
# Colours web/stepcache.js draws the cond / uncond series in (BRANCH_COLORS).
BRANCH_RGB = {"cond": (0x4E, 0xA1, 0xFF), "uncond": (0xFF, 0x9F, 0x43)}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    """CI must really run this test; a developer machine without a browser just skips it."""
    if _flag("CI") or _flag("STEPCACHE_REQUIRE_BROWSER"):
        pytest.fail(f"browser test required (CI / STEPCACHE_REQUIRE_BROWSER) but {reason}", pytrace=False)
    pytest.skip(reason)


def _find_chromium() -> str | None:
    explicit = os.environ.get("STEPCACHE_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("playwright is not installed in the host Python (it is in scripts/host-lock.txt)")
    path = _find_chromium()
    if path is None:
        _unavailable("no Chromium found (apt-get install chromium, or set STEPCACHE_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def ui_server(chromium):
    """A server of its own: the page's client id, not the test's, gets the stats events."""
    from harness.server import ComfyServer

    with ComfyServer() as running:
        # The first visit otherwise opens the templates dialog over the canvas.
        request = urllib.request.Request(
            running.url + "/settings", data=json.dumps({"Comfy.TutorialCompleted": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        yield running


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        launched = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()
    finally:
        playwright.stop()


class Frontend:
    """One page of the real frontend, and the errors the extension raised in it."""

    def __init__(self, page, server) -> None:
        self.page = page
        self.server = server
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self._note(f"{error}\n{getattr(error, 'stack', '')}"))
        page.on("console", lambda message: message.type == "error" and self._note(message.text))

    def _note(self, text: str) -> None:
        # The frontend logs errors of its own (missing templates, no network); only ours count.
        if "stepcache" in text.lower():
            self.errors.append(text)

    def open(self) -> None:
        self.page.goto(self.server.url)
        self.page.wait_for_function(
            "() => window.app?.graph && (window.app.extensions ?? []).some((e) => e.name === 'StepCache.Stats')",
            timeout=60_000,
        )

    def run(self, graph: dict, name: str) -> str:
        """Loads an API graph into the canvas, queues it from the page; the finished prompt's id."""
        self.page.evaluate("async ([g, name]) => { await window.app.loadApiJson(g, name); }", [graph, name])
        with self.page.expect_response(
            lambda r: r.url.endswith("/prompt") and r.request.method == "POST"
        ) as response:
            self.page.evaluate("async () => { await window.app.queuePrompt(0); }")
        assert response.value.ok, response.value.text()[:3000]
        prompt_id = response.value.json()["prompt_id"]
        entry = self.server.wait(prompt_id, timeout=90)
        assert entry["status"]["status_str"] == "success", entry["status"]
        return prompt_id

    def node_id(self, class_type: str) -> int | str:
        """The id the canvas gave the one node of this type (numeric API ids become numbers)."""
        (found,) = self.page.evaluate(
            "(type) => window.app.graph.nodes.filter((n) => n.type === type).map((n) => n.id)", class_type
        )
        return found

    def panel(self, node_id: int | str, ready: str) -> dict:
        """What the node's stepcache panel shows, once `ready` (a JS test on the element) holds."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        self.page.wait_for_function(
            "([id, ready]) => { const e = window.app.graph.getNodeById(id)?.stepcachePanel;"
            " return !!e && new Function('e', 'return ' + ready)(e); }",
            arg=[node_id, ready], timeout=20_000,
        )
        # The node is resized in the next animation frame and the DOM widget follows on a redraw.
        fits = "([id]) => { const e = window.app.graph.getNodeById(id).stepcachePanel;" \
               " return e.clientHeight > 0 && e.scrollHeight <= e.clientHeight + 1; }"
        with contextlib.suppress(PlaywrightTimeout):  # the assertions report the sizes
            self.page.wait_for_function(fits, arg=[node_id], timeout=5_000)
        # A panel that asks for the height it was given plus a little grows the node every frame.
        height = "(id) => window.app.graph.getNodeById(id).size[1]"
        before = self.page.evaluate(height, node_id)
        self.page.wait_for_timeout(600)
        shown = self.page.evaluate(
            """(id) => {
                const e = window.app.graph.getNodeById(id).stepcachePanel;
                const box = e.getBoundingClientRect();
                const filled = (c) => getComputedStyle(c).backgroundColor.replace(/\\s/g, "") !== "rgba(0,0,0,0)";
                return {
                    connected: e.isConnected, display: getComputedStyle(e).display,
                    box: [box.x, box.y, box.width, box.height],
                    clientHeight: e.clientHeight, scrollHeight: e.scrollHeight,
                    lines: [...e.querySelectorAll("div")]
                        .filter((d) => d.childElementCount === 0 && !d.classList.contains("stepcache-pattern"))
                        .map((d) => d.textContent),
                    patterns: [...e.querySelectorAll(".stepcache-pattern")]
                        .map((bar) => [...bar.children].map((c) => (filled(c) ? "C" : "S")).join("")),
                };
            }""",
            node_id,
        )
        shown["node_heights"] = [before, self.page.evaluate(height, node_id)]
        return shown

    def focus(self, node_id: int | str) -> None:
        """Canvas at 100 % with the node near the top left, so the screenshot is readable."""
        self.page.evaluate(
            """(id) => {
                const node = window.app.graph.getNodeById(id), ds = window.app.canvas.ds;
                ds.scale = 1;
                ds.offset[0] = 120 - node.pos[0];
                ds.offset[1] = 160 - node.pos[1];
                window.app.canvas.setDirty(true, true);
            }""",
            node_id,
        )
        self.page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")

    def screenshot(self, tmp_path: pathlib.Path, name: str) -> pathlib.Path:
        path = tmp_path / f"{name}.png"
        self.page.screenshot(path=str(path))
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, OUT_DIR / path.name)
        return path


@pytest.fixture
def frontend(browser, ui_server):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    context.set_default_timeout(30_000)
    try:
        ui = Frontend(context.new_page(), ui_server)
        ui.open()
        yield ui
        assert not ui.errors, "the extension raised errors in the page:\n" + "\n".join(ui.errors)
    finally:
        context.close()


def assert_not_blank(path: pathlib.Path, min_stddev: float) -> None:
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        stddev = ImageStat.Stat(image.convert("L")).stddev[0]
    assert stddev > min_stddev, f"{path} looks blank (grey-level stddev {stddev:.1f})"


def assert_panel_fits(shown: dict) -> None:
    assert shown["connected"] and shown["display"] != "none", shown
    assert shown["box"][2] > 50 and shown["box"][3] > 20, f"panel not on screen: {shown['box']}"
    assert shown["scrollHeight"] <= shown["clientHeight"] + 1, (
        f"panel clipped: content {shown['scrollHeight']} px in {shown['clientHeight']} px"
    )
    before, after = shown["node_heights"]
    assert after == before, f"the node keeps growing: {before} -> {after} px in 0.6 s"


def assert_panel_matches_stats(shown: dict, run: dict) -> None:
    assert_panel_fits(shown)
    lines = shown["lines"]
    branch_lines = [
        f"{b['branch']}: skipped {b['steps_skipped']}/{b['steps_computed'] + b['steps_skipped']} steps"
        for b in run["branches"]
    ]
    assert lines[: len(branch_lines)] == branch_lines, lines
    # One cell per step: filled where the server's pattern says computed.
    assert shown["patterns"] == [b["pattern"] for b in run["branches"]]
    match = re.fullmatch(r"block stack (\d+)/(\d+) calls: (\d+\.\d\d)x", lines[len(branch_lines)])
    assert match, lines
    computed, calls, speedup = int(match[1]), int(match[2]), float(match[3])
    assert (computed, calls) == (run["calls_computed"], run["calls_computed"] + run["calls_skipped"])
    # Compared as numbers: JS toFixed and Python's format round ties differently.
    assert abs(speedup - run["stack_speedup"]) <= 0.005 + 1e-9, (speedup, run["stack_speedup"])
    assert lines[len(branch_lines) + 1 :] == [run["label"]], lines


def test_magcache_panel_shows_the_servers_stats(frontend, ui_server, tmp_path):
    graph = json.loads((WORKFLOWS / "demo_image_magcache.json").read_text())
    prompt_id = frontend.run(graph, "demo_image_magcache")
    cache = frontend.node_id("ApplyMagCache")
    (run,) = ui_server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    assert run["node"] == str(cache) and run["method"] == "MagCache" and run["disabled_reason"] is None
    assert run["calls_skipped"] > 0, "the demo is meant to skip steps"
    assert {b["branch"] for b in run["branches"]} == {"cond", "uncond"}

    frontend.focus(cache)
    shown = frontend.panel(cache, "e.textContent.includes('block stack')")
    assert_panel_matches_stats(shown, run)

    path = frontend.screenshot(tmp_path, "magcache")
    assert_not_blank(path, min_stddev=10)
    # The panel alone, clipped from the page: an element screenshot waits for the element to be
    # "stable", which a DOM widget the canvas repositions every frame never is.
    x, y, width, height = shown["box"]
    panel_path = tmp_path / "magcache_panel.png"
    frontend.page.screenshot(path=str(panel_path), clip={"x": x, "y": y, "width": width, "height": height})
    shutil.copy(panel_path, OUT_DIR / panel_path.name)
    assert_not_blank(panel_path, min_stddev=5)


def test_calibrate_node_plots_the_measured_ratios(frontend, ui_server, tmp_path):
    graph = json.loads((WORKFLOWS / "demo_image_calibrate_magcache.json").read_text())
    prompt_id = frontend.run(graph, "demo_image_calibrate_magcache")
    calibrate, cache = frontend.node_id("MagCacheCalibrate"), frontend.node_id("ApplyMagCache")
    history = ui_server.get(f"/history/{prompt_id}")[prompt_id]
    series = history["outputs"][str(calibrate)]["stepcache_ratios"]
    branches = [s["branch"] for s in series]
    assert set(branches) == {"cond", "uncond"} and all(len(s["ratios"]) > 5 for s in series)

    frontend.focus(calibrate)
    shown = frontend.panel(calibrate, "!!e.querySelector('canvas.stepcache-ratio-plot')")
    assert_panel_fits(shown)
    assert shown["lines"] == [f"magnitude ratio per step ({' / '.join(branches)}); dashed = 1.0"]
    plot = frontend.page.evaluate(
        """(colors) => {
            const canvas = document.querySelector("canvas.stepcache-ratio-plot");
            const box = canvas.getBoundingClientRect();
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            const near = Object.fromEntries(Object.keys(colors).map((k) => [k, 0]));
            let painted = 0;
            for (let i = 0; i < data.length; i += 4) {
                if (data[i + 3] < 128) continue;
                painted++;
                for (const [k, [r, g, b]] of Object.entries(colors)) {
                    if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 60) near[k]++;
                }
            }
            return { painted, near, width: box.width, height: box.height };
        }""",
        BRANCH_RGB,
    )
    # Each branch's line crosses the plot: far more than a handful of pixels in its colour.
    assert plot["width"] > 100 and plot["height"] > 50, plot
    assert plot["painted"] > 500, plot
    assert all(plot["near"][b] > 50 for b in branches), plot

    # The cached sampler of the same graph reports on its own node.
    (run,) = [r for r in ui_server.get(f"/stepcache/stats?prompt_id={prompt_id}") if r["node"] == str(cache)]
    assert_panel_matches_stats(frontend.panel(cache, "e.textContent.includes('block stack')"), run)

    assert_not_blank(frontend.screenshot(tmp_path, "calibrate"), min_stddev=10)
