"""The web extension (web/stepcache.js) in the real ComfyUI frontend, driven by headless Chromium.

The real server serves its own frontend package and this pack's web/ folder. The browser loads the
example workflows in the UI format users open (example_workflows/*.json, laid out by
scripts/make_workflows.py), in each node rendering the frontend has: the classic canvas and, where
the frontend has it, Nodes 2.0 (Vue nodes, setting Comfy.VueNodes.Enabled). It checks that the
frontend queues each file as its API twin, queues the demo graphs from the page, compares the
panels the extension draws with what the server reports (GET /stepcache/stats), and checks that no
panel is covered by another node after a run.

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
from test_example_workflows import LATER_WIDGETS

from harness.host import comfyui_version

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.timeout(300)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
UI_DIR = REPO_ROOT / "example_workflows"
API_DIR = UI_DIR / "api"
# Screenshots are also kept here (git-ignored) so they can be looked at after a run.
OUT_DIR = REPO_ROOT / "out" / "browser"
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]
# Colours web/stepcache.js draws the cond / uncond series in (BRANCH_COLORS).
BRANCH_RGB = {"cond": (0x4E, 0xA1, 0xFF), "uncond": (0xFF, 0x9F, 0x43)}
VUE_NODES_SETTING = "Comfy.VueNodes.Enabled"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def renderings() -> list[str]:
    """Nodes 2.0 is tested from ComfyUI 0.30.0's frontend (1.47) on, where users meet it (its
    default for new installs); 0.3.75's frontend has it only as an experiment."""
    return ["classic", "vue"] if _version_tuple(comfyui_version()) >= (0, 30) else ["classic"]


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


def post_settings(server, settings: dict) -> None:
    """The user's settings file, as the frontend's settings dialog writes it (read at page load)."""
    request = urllib.request.Request(
        server.url + "/settings", data=json.dumps(settings).encode(), headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


@pytest.fixture(scope="module")
def ui_server(chromium):
    """A server of its own: the page's client id, not the test's, gets the stats events."""
    from harness.server import ComfyServer

    with ComfyServer() as running:
        # The first visit otherwise opens the templates dialog over the canvas, and the real-model
        # examples a dialog about model files this host does not have. Without persistence a new
        # page does not restore the previous test's workflows while a test loads its own.
        post_settings(running, {"Comfy.TutorialCompleted": True, "Comfy.Workflow.ShowMissingModelsWarning": False,
                                "Comfy.Workflow.ShowMissingNodesWarning": False, "Comfy.Workflow.Persist": False})
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


# Screen rectangles [x, y, width, height] of every node (title bar included) and of every panel of
# the extension, in either rendering: Vue nodes are DOM elements; classic nodes are drawn on the
# canvas at pos/size (title above pos), mapped to the screen through the canvas transform.
GEOMETRY_JS = """
() => {
    const graph = window.app.graph, canvas = window.app.canvas, ds = canvas.ds;
    const box = canvas.canvas.getBoundingClientRect();
    const titleHeight = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
    const rect = (r) => [r.x, r.y, r.width, r.height];
    const nodes = {}, panels = {};
    for (const node of graph.nodes) {
        const element = document.querySelector(`[data-node-id="${node.id}"]`);
        nodes[node.id] = element ? rect(element.getBoundingClientRect()) : [
            box.left + (node.pos[0] + ds.offset[0]) * ds.scale,
            box.top + (node.pos[1] - titleHeight + ds.offset[1]) * ds.scale,
            node.size[0] * ds.scale, (node.size[1] + titleHeight) * ds.scale,
        ];
        const panel = graph.getNodeById(node.id).stepcachePanel;
        if (panel) panels[node.id] = rect(panel.getBoundingClientRect());
    }
    return { nodes, panels, vue: !!document.querySelector("[data-node-id]"), viewport: [innerWidth, innerHeight] };
}
"""

# The ids of the nodes in the frontend's graph, as sorted strings (the API graph's keys).
GRAPH_IDS_JS = "window.app.graph.nodes.map((n) => String(n.id)).sort()"
# What settle() waits to stop changing: the rectangles the layout checks measure, the nodes' own
# positions and sizes, and the canvas transform.
LAYOUT_JS = ("[(" + GEOMETRY_JS.strip() + ")(), window.app.graph.nodes.map((n) => [n.id, ...n.pos, ...n.size]),"
             " window.app.canvas.ds.scale, ...window.app.canvas.ds.offset]")
# settle(): the layout is settled once it is the same this many animation frames in a row.
SETTLED_FRAMES = 10
# panel(): the node must keep its height while this many frames are drawn (about 0.6 s at 60 fps).
GROWTH_FRAMES = 36

# Of a panel's visible area, the points where another node is on top (Vue nodes are DOM elements
# that can stack over the panel's element). The frontend's own overlays (toolbars, toasts) do not
# count: they float over whatever is beneath.
COVERED_POINTS_JS = """
([id, steps]) => {
    const panel = window.app.graph.getNodeById(id).stepcachePanel, r = panel.getBoundingClientRect();
    const covered = [];
    for (let i = 0; i <= steps; i++) for (let j = 0; j <= steps; j++) {
        const x = r.left + 2 + (r.width - 4) * i / steps, y = r.top + 2 + (r.height - 4) * j / steps;
        const owner = document.elementFromPoint(x, y)?.closest("[data-node-id]");
        if (owner && owner.dataset.nodeId !== String(id))
            covered.push([Math.round(x), Math.round(y), owner.dataset.nodeId]);
    }
    return covered;
}
"""


def _overlap(a: list[float], b: list[float]) -> float:
    width = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    height = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
    return max(0.0, width) * max(0.0, height)


class Frontend:
    """One page of the real frontend in one node rendering, and the errors the extension raised."""

    def __init__(self, page, server, rendering: str) -> None:
        self.page = page
        self.server = server
        self.rendering = rendering
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self._note(f"{error}\n{getattr(error, 'stack', '')}"))
        page.on("console", lambda message: message.type == "error" and self._note(message.text))

    def _note(self, text: str) -> None:
        # The frontend logs errors of its own (missing templates, no network); only ours count.
        if "stepcache" in text.lower():
            self.errors.append(text)

    def open(self) -> None:
        """The page, once the frontend has started: our extension registered, and the frontend done
        with its own start-up workflow. Frontend 1.47 (ComfyUI 0.30.0) loads its default graph
        (node ids 9 and 62-71) after window.app exists, under its start-up spinner; an example
        loaded before that ends is replaced by the default graph (issue 21)."""
        post_settings(self.server, {VUE_NODES_SETTING: self.rendering == "vue"})
        self.page.goto(self.server.url)
        self.wait_until(
            "() => !!window.app?.graph && (window.app.extensions ?? []).some((e) => e.name === 'StepCache.Stats')"
            " && !window.app.extensionManager?.spinner && !document.getElementById('splash-loader')",
            what="the frontend to finish starting (extension registered, start-up spinner off)",
            timeout=120_000,
            state="() => ({ app: !!window.app, spinner: window.app?.extensionManager?.spinner,"
                  " splash: !!document.getElementById('splash-loader'),"
                  " extensions: (window.app?.extensions ?? []).map((e) => e.name)"
                  ".filter((n) => n.includes('StepCache')) })",
        )

    def wait_until(self, condition: str, what: str, arg=None, timeout: float = 60_000, state: str | None = None,
                   polling: str | float = "raf") -> None:
        """Waits for a JS condition on the page; on time-out, fails saying what was awaited and, with
        `state` (a JS function of `arg`), what the page held instead."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            self.page.wait_for_function(condition, arg=arg, timeout=timeout, polling=polling)
        except PlaywrightTimeout:
            held = self.page.evaluate(state, arg) if state else None
            raise AssertionError(f"timed out after {timeout / 1000:.0f} s waiting for {what}"
                                 + (f"; the page holds {held}" if state else "")) from None

    def load(self, name: str) -> dict:
        """Opens example_workflows/<name>.json as a user does; returns what the frontend would queue,
        once the frontend holds exactly this file's nodes (by id) in the expected rendering."""
        ui = json.loads((UI_DIR / f"{name}.json").read_text())
        ids = sorted(str(node["id"]) for node in ui["nodes"])
        self.page.evaluate("async ([g, name]) => { await window.app.loadGraphData(g, true, true, name); }", [ui, name])
        self.wait_until(
            f"(ids) => JSON.stringify({GRAPH_IDS_JS}) === JSON.stringify(ids)", arg=ids,
            what=f"the frontend's graph to hold exactly the nodes of {name}.json {ids}",
            state=f"() => {GRAPH_IDS_JS}",
        )
        if self.rendering == "vue":
            # Nodes 2.0 mounts one element per node (after the graph is configured).
            self.wait_until(
                "(ids) => ids.every((id) => document.querySelector(`[data-node-id=\"${id}\"]`))", arg=ids,
                what=f"{name}: every node's element in the Nodes 2.0 rendering",
                state="() => [...document.querySelectorAll('[data-node-id]')].map((e) => e.dataset.nodeId)",
            )
        self.settle()
        # The classic rendering has nothing to wait for: it must simply have mounted no node element.
        vue = self.page.evaluate("() => !!document.querySelector('[data-node-id]')")
        assert vue == (self.rendering == "vue"), f"{name}: expected the {self.rendering} rendering"
        return self.page.evaluate("async () => (await window.app.graphToPrompt()).output")

    def settle(self, frames: int = SETTLED_FRAMES) -> None:
        """Until the layout the tests measure stops changing: the same node and panel rectangles (and
        node sizes, canvas transform) over `frames` animation frames in a row. Node resizes and DOM
        widget moves happen on redraws, one or two frames after the change that causes them; frames
        come slower on a busy machine, but each one still does its part of the work."""
        self.page.evaluate("() => { window.__stepcacheSettle = { key: null, same: 0 }; }")
        self.wait_until(
            f"""(frames) => {{
                const state = window.__stepcacheSettle, key = JSON.stringify({LAYOUT_JS});
                if (key === state.key) state.same++; else {{ state.key = key; state.same = 0; }}
                return state.same >= frames;
            }}""",
            arg=frames, what=f"the layout to stay the same for {frames} animation frames",
            state=f"() => {LAYOUT_JS}",
        )

    def run(self, name: str) -> str:
        """Loads a UI example, queues it from the page; the finished prompt's id.

        The seeds move by the rendering's index first: the server runs each example once per
        rendering, and a graph it ran already would come from its cache, with nothing to report."""
        queued = self.load(name)
        assert_queued_as_api_twin(queued, name, self.server)
        self.page.evaluate(
            """(offset) => { for (const node of window.app.graph.nodes) for (const widget of node.widgets ?? [])
                if (["seed", "noise_seed"].includes(widget.name)) widget.value += offset; }""",
            renderings().index(self.rendering),
        )
        with self.page.expect_response(
            lambda r: r.url.endswith("/prompt") and r.request.method == "POST"
        ) as response:
            self.page.evaluate("async () => { await window.app.queuePrompt(0); }")
        assert response.value.ok, response.value.text()[:3000]
        prompt_id = response.value.json()["prompt_id"]
        entry = self.server.wait(prompt_id, timeout=120)
        assert entry["status"]["status_str"] == "success", entry["status"]
        return prompt_id

    def node_id(self, title: str) -> int:
        """The id of the node with this title (titles are unique in the examples)."""
        (found,) = self.page.evaluate(
            "(title) => window.app.graph.nodes.filter((n) => n.title === title).map((n) => n.id)", title
        )
        return found

    def panel(self, node_id: int, ready: str) -> dict:
        """What the node's stepcache panel shows, once `ready` (a JS test on the element) holds."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        self.wait_until(
            "([id, ready]) => { const e = window.app.graph.getNodeById(id)?.stepcachePanel;"
            " return !!e && new Function('e', 'return ' + ready)(e); }",
            arg=[node_id, ready], what=f"node {node_id}'s panel to show {ready}",
            state="([id]) => window.app.graph.getNodeById(id)?.stepcachePanel?.textContent ?? null",
        )
        # The node is resized in the next animation frame and the DOM widget follows on a redraw.
        fits = "([id]) => { const e = window.app.graph.getNodeById(id).stepcachePanel;" \
               " return e.clientHeight > 0 && e.scrollHeight <= e.clientHeight + 1; }"
        with contextlib.suppress(PlaywrightTimeout):  # the assertions report the sizes
            self.page.wait_for_function(fits, arg=[node_id], timeout=30_000, polling="raf")
        # A panel that asks for the height it was given plus a little grows the node every frame:
        # the node's height in each of GROWTH_FRAMES frames, each one redrawn (counted in frames,
        # not seconds, so that a slow machine watches as many resizes as a fast one).
        heights = self.page.evaluate(
            """([id, frames]) => new Promise((resolve) => {
                const heights = [];
                const step = () => {
                    heights.push(window.app.graph.getNodeById(id).size[1]);
                    if (heights.length > frames) return resolve(heights);
                    window.app.canvas.setDirty(true, true);
                    requestAnimationFrame(step);
                };
                step();
            })""",
            [node_id, GROWTH_FRAMES],
        )
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
        shown["node_heights"] = [heights[0], heights[-1]]
        shown["node_heights_seen"] = sorted(set(heights))
        return shown

    def focus(self, node_id: int) -> None:
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
        self.settle()

    def fit_all(self) -> None:
        """The whole graph in the viewport (for the layout checks: points off screen hit nothing)."""
        self.page.evaluate(
            """() => {
                const canvas = window.app.canvas, ds = canvas.ds, nodes = window.app.graph.nodes;
                const left = Math.min(...nodes.map((n) => n.pos[0])) - 40;
                const top = Math.min(...nodes.map((n) => n.pos[1])) - 80;
                const right = Math.max(...nodes.map((n) => n.pos[0] + n.size[0])) + 40;
                const bottom = Math.max(...nodes.map((n) => n.pos[1] + n.size[1])) + 300;
                const box = canvas.canvas.getBoundingClientRect();
                ds.scale = Math.min(box.width / (right - left), box.height / (bottom - top));
                ds.offset[0] = -left;
                ds.offset[1] = -top;
                canvas.setDirty(true, true);
            }"""
        )
        self.settle()

    def assert_panels_uncovered(self, name: str, expected: int) -> dict:
        """No node overlaps another (title bars included), no node covers a panel, in this rendering."""
        self.fit_all()
        geometry = self.page.evaluate(GEOMETRY_JS)
        assert geometry["vue"] == (self.rendering == "vue")
        nodes, panels = geometry["nodes"], geometry["panels"]
        assert len(panels) == expected, f"{name}: panels on nodes {sorted(panels)}, expected {expected}"
        titles = dict(self.page.evaluate("() => window.app.graph.nodes.map((n) => [String(n.id), n.title])"))
        problems = []
        for panel_id, panel in panels.items():
            for other, rect in nodes.items():
                if other != panel_id and _overlap(panel, rect) > 1:
                    problems.append(f"the panel of {titles[panel_id]!r} is under {titles[other]!r}")
            if geometry["vue"]:
                covered = self.page.evaluate(COVERED_POINTS_JS, [int(panel_id), 8])
                if covered:
                    problems.append(f"the panel of {titles[panel_id]!r} is covered at {covered[:5]}")
        ids = sorted(nodes)
        for i, first in enumerate(ids):
            for second in ids[i + 1:]:
                if _overlap(nodes[first], nodes[second]) > 1:
                    problems.append(f"{titles[first]!r} overlaps {titles[second]!r}")
        assert not problems, f"{name} ({self.rendering}): " + "; ".join(problems)
        return geometry

    def screenshot(self, tmp_path: pathlib.Path, name: str) -> pathlib.Path:
        path = tmp_path / f"{name}-{self.rendering}.png"
        self.page.screenshot(path=str(path))
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, OUT_DIR / path.name)
        return path

    def screenshot_clip(self, tmp_path: pathlib.Path, name: str, box: list[float]) -> pathlib.Path:
        # An element screenshot waits for the element to be "stable", which a DOM widget the canvas
        # repositions every frame never is: clip the page instead.
        x, y, width, height = box
        path = tmp_path / f"{name}-{self.rendering}.png"
        self.page.screenshot(path=str(path), clip={"x": x, "y": y, "width": width, "height": height})
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, OUT_DIR / path.name)
        return path


@pytest.fixture(params=renderings())
def frontend(request, browser, ui_server):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    context.set_default_timeout(30_000)
    try:
        ui = Frontend(context.new_page(), ui_server, request.param)
        ui.open()
        yield ui
        assert not ui.errors, "the extension raised errors in the page:\n" + "\n".join(ui.errors)
    finally:
        context.close()


def assert_queued_as_api_twin(queued: dict, name: str, server) -> None:
    """The frontend turns the UI file into its API twin: the same nodes, titles and inputs. (Of the
    inputs, those the node declares: the server ignores any other, such as the display widget
    "preview" that frontend 1.32 sends for PreviewAny; and an older ComfyUI's frontend sends none
    of the widgets a newer one added, LATER_WIDGETS.)"""
    api = json.loads((API_DIR / f"{name}.json").read_text())
    assert sorted(queued) == sorted(api), f"{name}: nodes {sorted(queued)} != {sorted(api)}"
    for node_id, node in api.items():
        sent = queued[node_id]
        assert sent["class_type"] == node["class_type"], f"{name} node {node_id}"
        declared = server.get(f"/object_info/{node['class_type']}")[node["class_type"]]["input"]
        names = set(declared.get("required", {})) | set(declared.get("optional", {}))
        inputs = {key: value for key, value in sent["inputs"].items() if key in names}
        later = set(LATER_WIDGETS.get(node["class_type"], ())) - names
        expected = {key: value for key, value in node["inputs"].items() if key not in later}
        assert inputs == expected, f"{name} node {node_id} ({node['class_type']}): inputs"
        assert sent.get("_meta", {}).get("title", node["_meta"]["title"]) == node["_meta"]["title"], name


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
    assert after == before, (
        f"the node keeps growing: {before} -> {after} px over {GROWTH_FRAMES} frames "
        f"(heights {shown['node_heights_seen']})"
    )


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
    prompt_id = frontend.run("demo_image_magcache")
    cache = frontend.node_id("Apply MagCache")
    (run,) = ui_server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    # The demo graph runs Apply MagCache at quality balanced: the measured-error rule.
    assert run["node"] == str(cache) and run["method"] == "measured error" and run["disabled_reason"] is None
    assert run["calls_skipped"] > 0, "the demo is meant to skip steps"
    assert {b["branch"] for b in run["branches"]} == {"cond", "uncond"}

    frontend.focus(cache)
    shown = frontend.panel(cache, "e.textContent.includes('block stack')")
    assert_panel_matches_stats(shown, run)
    assert_not_blank(frontend.screenshot(tmp_path, "magcache"), min_stddev=10)
    assert_not_blank(frontend.screenshot_clip(tmp_path, "magcache_panel", shown["box"]), min_stddev=5)

    frontend.assert_panels_uncovered("demo_image_magcache", expected=1)
    frontend.screenshot(tmp_path, "magcache_graph")


def test_calibrate_node_shows_its_run_and_plots_the_measured_ratios(frontend, ui_server, tmp_path):
    prompt_id = frontend.run("demo_image_calibrate_magcache")
    calibrate, cache = frontend.node_id("MagCache Calibrate"), frontend.node_id("Apply MagCache")
    history = ui_server.get(f"/history/{prompt_id}")[prompt_id]
    series = history["outputs"][str(calibrate)]["stepcache_ratios"]
    branches = [s["branch"] for s in series]
    assert set(branches) == {"cond", "uncond"} and all(len(s["ratios"]) > 5 for s in series)
    runs = {run["node"]: run for run in ui_server.get(f"/stepcache/stats?prompt_id={prompt_id}")}
    assert sorted(runs) == sorted([str(calibrate), str(cache)]), runs
    measured = runs[str(calibrate)]
    assert measured["method"] == "calibration"

    frontend.focus(calibrate)
    shown = frontend.panel(calibrate, "!!e.querySelector('canvas.stepcache-ratio-plot')"
                                      " && e.textContent.includes('calibration run')")
    assert_panel_fits(shown)
    assert shown["lines"] == [
        f"calibration run: {measured['steps']} steps measured "
        f"({' / '.join(b['branch'] for b in measured['branches'])})",
        measured["label"],
        f"magnitude ratio per step ({' / '.join(branches)}); dashed = 1.0",
    ]
    plot = frontend.page.evaluate(
        """([id, colors]) => {
            const canvas = window.app.graph.getNodeById(id).stepcachePanel.querySelector("canvas.stepcache-ratio-plot");
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
        [calibrate, BRANCH_RGB],
    )
    # Each branch's line crosses the plot: far more than a handful of pixels in its colour.
    assert plot["width"] > 100 and plot["height"] > 50, plot
    assert plot["painted"] > 500, plot
    assert all(plot["near"][b] > 50 for b in branches), plot
    assert_not_blank(frontend.screenshot(tmp_path, "calibrate"), min_stddev=10)

    # The cached sampler of the same graph reports on its own node.
    assert_panel_matches_stats(frontend.panel(cache, "e.textContent.includes('block stack')"), runs[str(cache)])

    frontend.assert_panels_uncovered("demo_image_calibrate_magcache", expected=2)
    frontend.screenshot(tmp_path, "calibrate_graph")


def sample_stats(node_id: int, steps: int = 30) -> dict:
    """A run's stats as the server sends them: two CFG branches (the largest panel)."""
    pattern = "CCCCCC" + "SC" * ((steps - 6) // 2) + "C" * ((steps - 6) % 2)
    branches = [{"branch": b, "entries": 1, "steps_computed": pattern.count("C"),
                 "steps_skipped": pattern.count("S"), "pattern": pattern} for b in ("cond", "uncond")]
    computed = 2 * pattern.count("C")
    return {"node": str(node_id), "label": "flux / flux.1-dev", "method": "MagCache", "steps": steps,
            "branches": branches, "calls_computed": computed, "calls_skipped": 2 * steps - computed,
            "stack_speedup": 2 * steps / computed, "disabled_reason": None, "summary": ""}


@pytest.mark.parametrize("name", sorted(p.stem for p in UI_DIR.glob("*.json")))
def test_every_example_is_queued_as_its_api_twin_and_keeps_its_panels_uncovered(frontend, name, tmp_path):
    """All example graphs, the real-model ones included (this host has no model files to run them):
    the panels a run would add are shown through the extension's own functions, at full size."""
    queued = frontend.load(name)
    assert_queued_as_api_twin(queued, name, frontend.server)
    module = "/extensions/comfyui-stepcache/stepcache.js"
    count = frontend.page.evaluate(
        """async ([module, stats, ratios]) => {
            const { showStats, showRatios } = await import(module);
            let count = 0;
            for (const node of window.app.graph.nodes) {
                if (["ApplyMagCache", "ApplyTeaCache"].includes(node.type)) {
                    showStats(node, { ...stats, node: String(node.id) });
                    count++;
                } else if (["MagCacheCalibrate", "TeaCacheCalibrate"].includes(node.type)) {
                    showStats(node, { ...stats, node: String(node.id), method: "calibration" });
                    showRatios(node, ratios);
                    count++;
                }
            }
            return count;
        }""",
        [module, sample_stats(0), [{"branch": b, "ratios": [1.0 - 0.004 * i for i in range(30)]}
                                   for b in ("cond", "uncond")]],
    )
    assert count >= 1
    # Each panel is on the page with its content laid out; settle() (in fit_all) then waits for
    # the resizes showStats / showRatios schedule for the next frame, and for the redraws after.
    frontend.wait_until(
        "(count) => window.app.graph.nodes.filter((n) => n.stepcachePanel?.isConnected"
        " && n.stepcachePanel.firstChild.offsetHeight > 0).length === count",
        arg=count, what=f"{name}: {count} panels on the page",
        state="() => window.app.graph.nodes.filter((n) => n.stepcachePanel)"
              ".map((n) => [n.id, n.stepcachePanel.isConnected])",
    )
    frontend.assert_panels_uncovered(name, expected=count)
    frontend.screenshot(tmp_path, f"layout-{name}")
