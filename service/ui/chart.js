// The live loss curve: an inline SVG line chart of (step, loss), redrawn as progress events arrive.

const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 260, PAD = { left: 56, right: 16, top: 14, bottom: 34 };

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

export function lossChart() {
  const root = svg("svg", { id: "loss-curve", viewBox: `0 0 ${W} ${H}`, role: "img",
                            "aria-label": "training loss by step", "data-points": 0 });
  const points = [];
  let totalSteps = 0;

  function draw() {
    root.replaceChildren();
    root.setAttribute("data-points", points.length);
    const x0 = PAD.left, x1 = W - PAD.right, y0 = H - PAD.bottom, y1 = PAD.top;
    root.append(svg("line", { x1: x0, y1: y0, x2: x1, y2: y0, class: "axis" }),
                svg("line", { x1: x0, y1: y0, x2: x0, y2: y1, class: "axis" }));
    if (!points.length) {
      root.append(svg("text", { x: (x0 + x1) / 2, y: (y0 + y1) / 2, class: "empty", "text-anchor": "middle" },
                      "waiting for the first training step…"));
      return;
    }
    // The x axis spans the steps seen so far (the curve stays readable early in a long run).
    const maxStep = Math.max(points[points.length - 1].step, 1);
    const losses = points.map((p) => p.loss);
    let lo = Math.min(...losses), hi = Math.max(...losses);
    if (hi - lo < 1e-9) { lo -= 0.5; hi += 0.5; }
    const pad = (hi - lo) * 0.08;
    lo = Math.max(0, lo - pad);
    hi += pad;
    const sx = (s) => x0 + ((x1 - x0) * s) / maxStep;
    const sy = (v) => y0 - ((y0 - y1) * (v - lo)) / (hi - lo);
    for (const v of ticks(lo, hi, 4)) {
      root.append(svg("line", { x1: x0, y1: sy(v), x2: x1, y2: sy(v), class: "grid" }),
                  svg("text", { x: x0 - 6, y: sy(v) + 4, "text-anchor": "end" }, v.toFixed(3)));
    }
    for (const s of ticks(0, maxStep, Math.min(5, maxStep))) {
      root.append(svg("text", { x: sx(s), y: y0 + 16, "text-anchor": "middle" }, Math.round(s)));
    }
    root.append(svg("text", { x: (x0 + x1) / 2, y: H - 4, "text-anchor": "middle", class: "label" }, "step"),
                svg("text", { x: 12, y: (y0 + y1) / 2, "text-anchor": "middle", class: "label",
                              transform: `rotate(-90 12 ${(y0 + y1) / 2})` }, "loss"));
    const line = points.map((p) => `${sx(p.step).toFixed(1)},${sy(p.loss).toFixed(1)}`).join(" ");
    root.append(svg("polyline", { points: line, class: "loss" }));
    const last = points[points.length - 1];
    root.append(svg("circle", { cx: sx(last.step), cy: sy(last.loss), r: 3.5, class: "loss-dot" }),
                svg("text", { x: x1, y: y1 + 4, "text-anchor": "end", class: "last" },
                    `step ${last.step}${totalSteps ? ` of ${totalSteps}` : ""}: loss ${last.loss.toFixed(4)}`));
  }

  root.add = (event) => {
    if (typeof event.loss !== "number" || typeof event.step !== "number") return;
    totalSteps = event.total_steps || totalSteps;
    // A new attempt restarts at step 1 or at its checkpoint: its steps replace the old ones from there on.
    while (points.length && points[points.length - 1].step >= event.step) points.pop();
    points.push({ step: event.step, loss: event.loss });
    draw();
  };
  draw();
  return root;
}
