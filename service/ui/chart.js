// The live loss curve: an inline SVG line chart of (step, loss), redrawn as progress events arrive,
// on a linear or a log scale (the "log scale" button), with y labels sized to fit their numbers.

import { h } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 260, PAD = { right: 16, top: 14, bottom: 34 };
const CHAR_PX = 7; // an upper bound of one label character's width at the chart's 11px font
const MIN_LEFT = 56; // room for the rotated "loss" label and short numbers

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function ticks(lo, hi, count) {
  if (hi === lo) return [lo];
  return Array.from({ length: count + 1 }, (_, i) => lo + ((hi - lo) * i) / count);
}

// As many decimals as tell neighbouring ticks apart; an exponent for very large or small numbers.
export function tickLabel(value, step) {
  const size = Math.abs(value);
  if (size !== 0 && (size >= 1e6 || size < 1e-3)) return value.toExponential(2);
  const decimals = step > 0 ? Math.min(4, Math.max(0, 1 - Math.floor(Math.log10(step)))) : 3;
  return value.toFixed(decimals);
}

export function lossChart() {
  const plot = svg("svg", { id: "loss-curve", viewBox: `0 0 ${W} ${H}`, role: "img",
                            "aria-label": "training loss by step", "data-points": 0, "data-scale": "linear" });
  const toggle = h("button", { type: "button", id: "loss-scale", class: "small", "aria-pressed": "false",
                               title: "show the loss on a logarithmic scale" }, "log scale");
  const root = h("figure", { class: "chart" }, h("div", { class: "chart-tools" }, toggle), plot);
  const points = [];
  let totalSteps = 0;
  let logScale = false;
  let emptyText = "waiting for the first training step…";

  function draw() {
    plot.replaceChildren();
    plot.setAttribute("data-points", points.length);
    plot.setAttribute("data-scale", logScale ? "log" : "linear");
    const y0 = H - PAD.bottom, y1 = PAD.top;
    if (!points.length) {
      const x0 = MIN_LEFT, x1 = W - PAD.right;
      plot.append(svg("line", { x1: x0, y1: y0, x2: x1, y2: y0, class: "axis" }),
                  svg("line", { x1: x0, y1: y0, x2: x0, y2: y1, class: "axis" }),
                  svg("text", { x: (x0 + x1) / 2, y: (y0 + y1) / 2, class: "empty", "text-anchor": "middle" },
                      emptyText));
      return;
    }
    // A log scale plots log10(loss); a loss of 0 or less (possible for a custom loss) sits at the bottom.
    const positive = points.map((p) => p.loss).filter((v) => v > 0);
    const floor = positive.length ? Math.min(...positive) : 1e-12;
    const value = logScale ? (v) => Math.log10(Math.max(v, floor)) : (v) => v;
    const shown = points.map((p) => value(p.loss));
    let lo = Math.min(...shown), hi = Math.max(...shown);
    if (hi - lo < 1e-9) { lo -= 0.5; hi += 0.5; }
    const pad = (hi - lo) * 0.08;
    lo = logScale ? lo - pad : Math.max(0, lo - pad);
    hi += pad;
    const yTicks = ticks(lo, hi, 4);
    const labels = logScale ? yTicks.map((t) => tickLabel(10 ** t, 10 ** t / 10))
      : yTicks.map((t) => tickLabel(t, (hi - lo) / 4));
    // The left margin grows with the longest label, so none is cut off at the chart's edge.
    const x0 = Math.max(MIN_LEFT, 22 + CHAR_PX * Math.max(...labels.map((l) => l.length)));
    const x1 = W - PAD.right;
    plot.append(svg("line", { x1: x0, y1: y0, x2: x1, y2: y0, class: "axis" }),
                svg("line", { x1: x0, y1: y0, x2: x0, y2: y1, class: "axis" }));
    // The x axis spans the steps seen so far (the curve stays readable early in a long run).
    const maxStep = Math.max(points[points.length - 1].step, 1);
    const sx = (s) => x0 + ((x1 - x0) * s) / maxStep;
    const sy = (v) => y0 - ((y0 - y1) * (v - lo)) / (hi - lo);
    yTicks.forEach((t, i) => {
      plot.append(svg("line", { x1: x0, y1: sy(t), x2: x1, y2: sy(t), class: "grid" }),
                  svg("text", { x: x0 - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick" }, labels[i]));
    });
    for (const s of ticks(0, maxStep, Math.min(5, maxStep))) {
      plot.append(svg("text", { x: sx(s), y: y0 + 16, "text-anchor": "middle" }, Math.round(s)));
    }
    plot.append(svg("text", { x: (x0 + x1) / 2, y: H - 4, "text-anchor": "middle", class: "label" }, "step"),
                svg("text", { x: 12, y: (y0 + y1) / 2, "text-anchor": "middle", class: "label",
                              transform: `rotate(-90 12 ${(y0 + y1) / 2})` }, logScale ? "loss (log)" : "loss"));
    const line = points.map((p) => `${sx(p.step).toFixed(1)},${sy(value(p.loss)).toFixed(1)}`).join(" ");
    plot.append(svg("polyline", { points: line, class: "loss" }));
    const last = points[points.length - 1];
    plot.append(svg("circle", { cx: sx(last.step), cy: sy(value(last.loss)), r: 3.5, class: "loss-dot" }),
                svg("text", { x: x1, y: y1 + 4, "text-anchor": "end", class: "last" },
                    `step ${last.step}${totalSteps ? ` of ${totalSteps}` : ""}: loss ${last.loss.toFixed(4)}`));
  }

  toggle.addEventListener("click", () => {
    logScale = !logScale;
    toggle.setAttribute("aria-pressed", String(logScale));
    draw();
  });

  root.add = (event) => {
    if (typeof event.loss !== "number" || typeof event.step !== "number") return;
    totalSteps = event.total_steps || totalSteps;
    // A new attempt restarts at step 1 or at its checkpoint: its steps replace the old ones from there on.
    while (points.length && points[points.length - 1].step >= event.step) points.pop();
    points.push({ step: event.step, loss: event.loss });
    draw();
  };
  // An ended job that never reached a training step: say so instead of waiting for one.
  root.ended = (status) => {
    emptyText = status === "succeeded" ? "no training steps recorded"
      : `no training steps: the job ${status} before its first one`;
    if (!points.length) draw();
  };
  draw();
  return root;
}
