// StepCache web extension: after a run, show on each Apply TeaCache / Apply MagCache node what the
// cache did (steps computed and skipped per CFG branch, the block-stack speedup), and on the
// calibrate nodes what they measured (the run, and a plot of the ratios). Uses the frontend's public
// extension API and the server's "stepcache.stats" event; adds one display-only widget that is
// never saved in workflows. Works in both node renderings: the classic canvas, and Nodes 2.0
// (Vue), which mounts the widget's element inside the node and sizes the node to it.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const STATS_EVENT = "stepcache.stats";
const CALIBRATE_NODES = new Set(["MagCacheCalibrate", "TeaCacheCalibrate"]);
const APPLY_NODES = new Set(["ApplyTeaCache", "ApplyMagCache"]);
const BRANCH_COLORS = { cond: "#4ea1ff", uncond: "#ff9f43" };

// One section of the node's panel ("stats": what the run did; "plot": the measured ratios), in
// that order, created on first use, so that each event replaces only its own part.
function section(node, name) {
  const content = panel(node);
  let part = content.querySelector(`:scope > .stepcache-${name}`);
  if (!part) {
    part = document.createElement("div");
    part.className = `stepcache-${name}`;
    content.insertBefore(part, name === "stats" ? content.firstChild : null);
  }
  return part;
}

// The panel's content box (inside the DOM widget's element), created on first use.
function panel(node) {
  if (node.stepcachePanel) return node.stepcachePanel.firstChild;
  const element = document.createElement("div");
  element.className = "stepcache-panel";
  Object.assign(element.style, {
    font: "11px monospace", color: "var(--input-text, #ddd)", background: "rgba(0,0,0,0.25)",
    borderRadius: "4px", padding: "4px 6px", overflow: "hidden", boxSizing: "border-box",
  });
  // The content sits in a box of its own so its height can be measured whatever height the
  // frontend gives the element; flow-root keeps the children's margins inside it.
  const content = document.createElement("div");
  content.className = "stepcache-panel-content";
  content.style.display = "flow-root";
  element.appendChild(content);
  const widget = node.addDOMWidget("stepcache_stats", "stepcache", element, {
    serialize: false, hideOnZoom: false, getValue: () => "", setValue: () => {},
  });
  widget.serialize = false; // display only: saved workflows keep their widget values unchanged
  // The element gets the widget's height less a margin above and below, and its padding holds
  // 4px on each side. Measuring the element itself (scrollHeight) instead fed the height it was
  // given back into the size it asked for: the node either clipped the last line or grew forever.
  const margin = widget.margin ?? 10;
  widget.computeSize = (width) => [width, Math.max(24, content.offsetHeight + 8 + 2 * margin)];
  node.stepcachePanel = element;
  return content;
}

function line(text, style = {}) {
  const div = document.createElement("div");
  div.textContent = text;
  Object.assign(div.style, style);
  return div;
}

function patternBar(pattern, color) {
  const bar = document.createElement("div");
  bar.className = "stepcache-pattern";
  bar.title = "one cell per step: filled = computed, empty = reused the cache";
  Object.assign(bar.style, { display: "flex", gap: "1px", height: "8px", margin: "2px 0 4px" });
  for (const outcome of pattern) {
    const cell = document.createElement("span");
    Object.assign(cell.style, {
      flex: "1", background: outcome === "C" ? color : "transparent", border: `1px solid ${color}`,
    });
    bar.appendChild(cell);
  }
  return bar;
}

function resize(node) {
  requestAnimationFrame(() => {
    node.setSize([node.size[0], node.computeSize()[1]]);
    node.setDirtyCanvas(true, true);
  });
}

export function showStats(node, stats) {
  const content = section(node, "stats");
  content.replaceChildren();
  if (stats.method === "calibration") {
    // A calibration run computes every step: what it measured, not what it skipped.
    const branches = stats.branches.map((b) => b.branch).join(" / ");
    content.appendChild(line(`calibration run: ${stats.steps} steps measured (${branches})`));
  } else if (stats.disabled_reason) {
    content.appendChild(line(`uncached this run: ${stats.disabled_reason}`, { color: "#f0c674" }));
  } else {
    for (const branch of stats.branches) {
      const total = branch.steps_computed + branch.steps_skipped;
      content.appendChild(line(`${branch.branch}: skipped ${branch.steps_skipped}/${total} steps`));
      content.appendChild(patternBar(branch.pattern, BRANCH_COLORS[branch.branch] ?? "#aaa"));
    }
    const calls = stats.calls_computed + stats.calls_skipped;
    content.appendChild(line(
      `block stack ${stats.calls_computed}/${calls} calls: ${stats.stack_speedup.toFixed(2)}x`,
      { fontWeight: "bold" },
    ));
  }
  content.appendChild(line(stats.label, { opacity: "0.7" }));
  node.stepcacheStats = stats;
  resize(node);
}

export function showRatios(node, series) {
  const content = section(node, "plot");
  content.replaceChildren();
  const canvas = document.createElement("canvas");
  canvas.className = "stepcache-ratio-plot";
  canvas.width = 260;
  canvas.height = 110;
  Object.assign(canvas.style, { width: "100%", height: "110px" });
  content.appendChild(canvas);
  const ctx = canvas.getContext("2d");
  const values = series.flatMap((s) => s.ratios);
  const low = Math.min(0.9, ...values);
  const high = Math.max(1.1, ...values);
  const steps = Math.max(...series.map((s) => s.ratios.length));
  const x = (i) => 24 + (i / Math.max(1, steps - 1)) * (canvas.width - 30);
  const y = (v) => canvas.height - 12 - ((v - low) / (high - low)) * (canvas.height - 20);
  ctx.strokeStyle = "#666";
  ctx.setLineDash([3, 3]);
  ctx.beginPath();
  ctx.moveTo(x(0), y(1));
  ctx.lineTo(x(steps - 1), y(1));
  ctx.stroke();
  ctx.setLineDash([]);
  ctx.fillStyle = "#999";
  ctx.font = "10px monospace";
  ctx.fillText(high.toFixed(2), 0, 10);
  ctx.fillText(low.toFixed(2), 0, canvas.height - 12);
  for (const s of series) {
    ctx.strokeStyle = BRANCH_COLORS[s.branch] ?? "#aaa";
    ctx.beginPath();
    s.ratios.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
    ctx.stroke();
  }
  const legend = series.map((s) => `${s.branch}`).join(" / ");
  content.appendChild(line(`magnitude ratio per step (${legend}); dashed = 1.0`, { opacity: "0.7" }));
  resize(node);
}

// A workflow saved before the quality input existed has no value for it (it is the last widget):
// it runs at quality "custom", its saved inputs exactly as they were, as such API graphs do on the
// server. A node placed anew keeps the default level.
function keepSavedSettings(nodeType) {
  const onConfigure = nodeType.prototype.onConfigure;
  nodeType.prototype.onConfigure = function (info) {
    const result = onConfigure?.apply(this, arguments);
    const quality = this.widgets?.find((w) => w.name === "quality");
    const saved = info?.widgets_values;
    if (quality && Array.isArray(saved) && this.widgets.indexOf(quality) >= saved.length) quality.value = "custom";
    return result;
  };
}

app.registerExtension({
  name: "StepCache.Stats",
  setup() {
    api.addEventListener(STATS_EVENT, ({ detail }) => {
      const graph = app.graph;
      const node = graph?.getNodeById(Number(detail.node)) ?? graph?.getNodeById(detail.node);
      if (node) showStats(node, detail);
    });
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (APPLY_NODES.has(nodeData.name)) keepSavedSettings(nodeType);
    if (!CALIBRATE_NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (message?.stepcache_ratios) showRatios(this, message.stepcache_ratios);
    };
  },
});
