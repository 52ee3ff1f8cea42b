// #/jobs/<id> : one job — phase timeline, live loss curve, before/after report, frozen config,
// artifacts with downloads (listed while the job runs too), the engine's log lines (for a failed job,
// the last lines of its engine.log) and a cancel button while the job can still be cancelled.

import { download, getJson, postJson, request, streamEvents } from "./api.js";
import { lossChart } from "./chart.js";
import { bytes, duration, elapsed, h, number, progressBar, statusChip, when } from "./dom.js";
import { TERMINAL } from "./meta.js";
import { applyEvent, modelName } from "./jobs.js";

const ratio = (before, after) => (before ? `${(after / before).toFixed(2)}×` : "–");
const LOG_TAIL_LINES = 40;
// service/report_view.py's label and note, word for word.
const NONZERO_LABEL = "nonzero weights¹";
const NONZERO_NOTE = "¹ of the weight tensors only; an integer code counts when ≠ its zero point";
const GATE_LABEL = "quality gate"; // its row is red: the figures the job missed its limits by
const WARNING_LABEL = "warning"; // a yellow row per report.json `warnings` line
const ROW_CLASSES = { [GATE_LABEL]: "gate-failed", [WARNING_LABEL]: "warning" };

// An llm_quant report (job_process/llm_runner.py), as service/report_view.py llm_rows: perplexity in PyTorch
// and onnxruntime on held-out text, file bytes, prefill latency and tokens per second.
function llmRows(l) {
  const held = `${number(l.tokens.evaluation_tokens)} held-out tokens`;
  const change = (before, after) => `${after >= before ? "+" : ""}${((after / before - 1) * 100).toFixed(2)}%`;
  const rows = [["ONNX size", bytes(l.onnx_size_bytes.fp32), bytes(l.onnx_size_bytes.deploy),
                 ratio(l.onnx_size_bytes.fp32, l.onnx_size_bytes.deploy)]];
  for (const [runtime, label] of [["pytorch", "PyTorch"], ["onnxruntime", "onnxruntime"]]) {
    const [before, after] = [l.perplexity.fp32[runtime], l.perplexity.deploy[runtime]];
    rows.push([`perplexity, ${label} (${held})`, before.toFixed(3), after.toFixed(3), change(before, after)]);
  }
  const p = l.prefill;
  rows.push([`prefill, median (${p.tokens} tokens, ${p.threads} thread)`, `${p.fp32.median_ms.toFixed(2)} ms`,
             `${p.deploy.median_ms.toFixed(2)} ms`, `speed-up ${p.speedup.toFixed(2)}×`]);
  rows.push(["prefill tokens per second", number(Math.round(p.fp32.tokens_per_s)),
             number(Math.round(p.deploy.tokens_per_s)), ""]);
  return rows;
}

// The rows service/report_view.py prints in the CLI: FP32 model against the deploy model.
export function reportRows(r) {
  if (r.llm) return llmRows(r.llm);
  const rows = [
    ["ONNX size", bytes(r.onnx_size_bytes.fp32), bytes(r.onnx_size_bytes.deploy),
     ratio(r.onnx_size_bytes.fp32, r.onnx_size_bytes.deploy)],
    ["parameters", number(r.parameters.original), number(r.parameters.deploy.total),
     ratio(r.parameters.original, r.parameters.deploy.total)],
  ];
  // Weight tensors only; in the deploy model the integer codes that differ from their zero point.
  const nonzero = [r.parameters.fp32.nonzero_weights, r.parameters.deploy.nonzero_weights];
  if (nonzero.every((n) => n !== undefined)) {
    rows.push([NONZERO_LABEL, number(nonzero[0]), number(nonzero[1]),
               ratio(nonzero[0], nonzero[1])]);
  }
  if (r.accuracy) {
    const drop = ((r.accuracy.deploy - r.accuracy.fp32) * 100).toFixed(2);
    rows.push([`accuracy (${r.eval.split}, ${r.eval.samples} samples)`, r.accuracy.fp32.toFixed(4),
               r.accuracy.deploy.toFixed(4), `${drop >= 0 ? "+" : ""}${drop} pts`]);
  }
  const pruning = r.pruning || {}; // the kinds that prune: units before and after
  for (const [unit, label] of [["heads", "attention heads"], ["channels", "channels (filters, FFN neurons)"]]) {
    const p = pruning[unit];
    if (p && p.groups) rows.push([label, number(p.before), number(p.after), ratio(p.before, p.after)]);
  }
  rows.push(...outputRows(r));
  const lat = r.latency_ms;
  const lengths = Object.values(lat.lengths || {});
  const at = lengths.length === 1 ? `, ${lengths[0]} tokens` : "";
  // the declared batch, then batch 8; at the dataset's length, then at 128 tokens (a model of token sequences)
  for (const t of [lat, ...(lat.other_batches || []), ...(lat.other_lengths || [])]) {
    const tokens = t.size !== undefined ? `, ${t.size} tokens` : at;
    rows.push([`latency, median (batch ${t.fp32.batch}${tokens})`, `${t.fp32.median.toFixed(3)} ms`,
               `${t.deploy.median.toFixed(3)} ms`, `speed-up ${t.speedup.toFixed(2)}×`]);
  }
  if (r.formats) rows.push(["format", r.formats.fp32 || "onnx", r.formats.deploy || "onnx", ""]);
  // The CPU kind the deploy model was written for ("auto" resolved on the worker) and its weight codes' width.
  if (r.deploy && r.deploy.deploy_target) {
    rows.push(["deploy CPU", "", r.deploy.deploy_target,
               r.deploy.weight_bits ? `${r.deploy.weight_bits}-bit weight codes` : ""]);
  }
  return rows;
}

const percent = (share) => `${(share * 100).toFixed(1)} %`;
const damageText = (row) => (row.top1_drop !== null && row.top1_drop !== undefined
  ? `${row.top1_drop.toFixed(2)} pts` : `cosine ${row.cosine.toFixed(4)}`);

// Set through the CSSOM: the dashboard's Content-Security-Policy refuses inline style attributes.
function damageFill(share) {
  const fill = h("span", { class: "fill" });
  fill.style.width = `${Math.round(Math.max(0, share) * 1000) / 10}%`;
  return fill;
}

// report.json's `sensitivity` (docs/spec/engine.md §4.11): one row per layer and variant, most damaging first,
// with a bar scaled to the largest damage.
// The before/after table (a yellow row per warning, a red one for a missed gate) and its footnote.
export function reportTable(r) {
  const rows = reportRows(r);
  return [h("table", { id: "report-table", class: "report" },
    h("thead", {}, h("tr", {}, ["", "before (FP32)", "after (deploy)", "change"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows.map((row) => h("tr", { class: ROW_CLASSES[row[0]] || null },
      row.map((c, i) => h(i ? "td" : "th", { class: i ? "num" : "" }, c)))))),
  rows.some((row) => row[0] === NONZERO_LABEL) ? h("p", { class: "muted note" }, NONZERO_NOTE) : ""];
}

export function sensitivityTable(s) {
  const worst = Math.max(1e-9, ...s.rows.map((r) => r.damage));
  return h("table", { id: "sensitivity-table", class: "report" },
    h("thead", {}, h("tr", {}, ["layer", "variant", "damage", "", "MACs", "weights"].map((t) => h("th", {}, t)))),
    h("tbody", {}, s.rows.map((r) => h("tr", {},
      h("th", {}, r.layer), h("td", {}, r.variant), h("td", { class: "num" }, damageText(r)),
      h("td", { class: "damage-bar" }, h("span", { class: "bar" }, damageFill(r.damage / worst))),
      h("td", { class: "num" }, percent(r.macs_share)), h("td", { class: "num" }, percent(r.bytes_share))))));
}

// report.json's `mixed_precision` (docs/spec/engine.md §4.12): the precision chosen per layer and what it gave.
export function mixedPrecisionTable(m) {
  const budget = Object.entries(m.budget).map(([k, v]) => `${k} ${v}`).join(", ");
  return h("div", { id: "mixed-precision" },
    h("p", {}, `budget ${budget} · deploy model: ${damageText(m.deployed)} (all-INT8: ${damageText(m.int8_deployed)})`
      + ` · weights ${bytes(m.weight_bytes)} vs ${bytes(m.int8_weight_bytes)} all-INT8`),
    h("table", { id: "precision-table", class: "report" },
      h("thead", {}, h("tr", {}, ["layer", "precision"].map((t) => h("th", {}, t)))),
      h("tbody", {}, Object.entries(m.precisions).map(([layer, p]) =>
        h("tr", {}, h("th", {}, layer), h("td", { class: `precision-${p}` }, p))))));
}

// Deploy against FP32 per output, as service/report_view.py output_rows.
function outputRows(r) {
  const outputs = r.outputs || { output: { deploy: r.agreement_with_original.deploy } };
  const names = Object.keys(outputs);
  const rows = [];
  for (const name of names) {
    const label = names.length > 1 ? ` (${name})` : "";
    const agree = outputs[name].deploy;
    if (agree.top1_agreement !== undefined) {
      rows.push([`top-1 agreement with FP32${label}`, "1.0000", agree.top1_agreement.toFixed(4), ""]);
    }
    rows.push([`output cosine with FP32${label}`, "1.0000", agree.mean_cosine.toFixed(4), ""]);
    if (agree.max_abs_diff !== undefined) {
      rows.push([`max abs difference${label}`, "0", agree.max_abs_diff.toFixed(4), `MSE ${agree.mse.toFixed(6)}`]);
    }
  }
  const gate = r.quality_gate;
  if (gate && !gate.passed) rows.push([GATE_LABEL, "", "FAILED", gate.failures.join("; ")]);
  // Slower than FP32, or more accuracy lost than the job allows (job_process/quality_gate.py `warnings`).
  for (const text of r.warnings || []) rows.push([WARNING_LABEL, "", "", text]);
  return rows;
}

// The model's inputs as its signature names them; a model uploaded before signatures has its example shape only.
function signatureText(model) {
  if (!model.inputs?.length) return `input ${model.input_shape.join("×")} ${model.input_dtype}`;
  return model.inputs.map((i) => `${i.name} [${i.shape.join(", ")}] ${i.dtype}`).join(", ");
}

function card(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), ...children);
}

function keyValues(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

export function jobView(id) {
  const ctl = new AbortController();
  const chart = lossChart();
  const bar = progressBar(0);
  const el = {
    title: h("h1", {}, `Job ${id.slice(0, 8)}`), status: h("span"), facts: h("div"), error: h("div"),
    timeline: h("ol", { id: "timeline", class: "timeline" }),
    report: h("div", { id: "report" }, h("p", { class: "muted" }, "The report appears when the job succeeds.")),
    config: h("div", { id: "frozen-config" }), artifacts: h("div", { id: "artifacts" }),
    log: h("ul", { id: "log", class: "log" }, h("li", { class: "muted empty" }, "No log lines.")),
    logTail: h("div", { id: "log-tail" }),
  };
  // Disabled until the job is known, hidden once it has ended: only a job that can be cancelled offers it.
  const cancel = h("button", { id: "cancel", class: "danger", onclick: onCancel, disabled: true }, "Cancel job");
  const node = h("div", { class: "job-page" },
    h("p", {}, h("a", { href: "#/" }, "← all jobs")),
    h("section", { class: "card head" }, h("div", { class: "title" }, el.title, el.status, cancel), bar, el.facts,
      el.error),
    h("div", { class: "grid" }, card("Phases", el.timeline), card("Training loss", chart)),
    card("Before / after", el.report),
    h("div", { class: "grid" }, card("Frozen config", el.config), card("Artifacts", el.artifacts)),
    card("Log", el.log, el.logTail));
  const phases = [];
  let job = null;
  let finished = false;

  function paint() {
    el.status.replaceChildren(statusChip(job.status));
    bar.update(job.progress, job.status);
    cancel.disabled = TERMINAL.has(job.status) || job.cancel_requested;
    cancel.hidden = TERMINAL.has(job.status);
    el.facts.replaceChildren(keyValues([
      ["kind", job.kind], ["device", job.device], ["phase", job.phase],
      ["attempt", job.attempt > 1 && job.attempt_started_at ? `${job.attempt}, since ${when(job.attempt_started_at)}` : job.attempt],
      ["created", when(job.created_at)], ["started", job.started_at && when(job.started_at)],
      ["finished", job.finished_at && when(job.finished_at)], ["elapsed", duration(elapsed(job))],
    ]));
    el.error.replaceChildren(job.error ? h("p", { class: "error-box" }, `${job.error.type}: ${job.error.detail || ""}`)
      : job.cancel_outcome === "pending" ? h("p", { class: "muted" }, "cancel requested…")
      : job.cancel_outcome === "too_late" ? h("p", { class: "muted" }, "the cancel came too late: the job had finished its work")
      : "");
  }

  function paintTimeline() {
    const now = Date.now();
    el.timeline.replaceChildren(...phases.map((p, i) => {
      const end = i + 1 < phases.length ? Date.parse(phases[i + 1].ts) : TERMINAL.has(job?.status) ? null : now;
      const live = i === phases.length - 1 && end !== null;
      return h("li", { class: live ? "current" : "", "data-phase": p.name },
        h("span", { class: "name" }, p.name), h("span", { class: "at" }, when(p.ts)),
        h("span", { class: "took" }, end === null ? "" : duration((end - Date.parse(p.ts)) / 1000)));
    }));
  }

  function onEvent(ev) {
    // A lost worker shows as `queued (requeued)` then `running (reclaimed)`.
    if (ev.type === "state") {
      const name = ["requeued", "reclaimed"].includes(ev.edge) ? `${ev.status} (${ev.edge})` : ev.status;
      phases.push({ name, ts: ev.ts });
    } else if (ev.type === "phase") {
      phases.push({ name: ev.phase, ts: ev.ts });
    } else if (ev.type === "progress") {
      chart.add(ev);
    } else if (ev.type === "log") {
      el.log.querySelector(".empty")?.remove();
      el.log.append(h("li", { class: ev.level || "info" }, h("time", {}, when(ev.ts)), ev.message));
    } else if (ev.type === "checkpoint") {
      refreshArtifactsSoon(); // a new train_state
    }
    if (job) {
      applyEvent(job, ev);
      paint();
    }
    paintTimeline();
    if (ev.type === "state" && TERMINAL.has(ev.status)) finish();
  }

  async function finish() {
    if (finished) return;
    finished = true;
    job = await getJson(`/v1/jobs/${id}`);
    paint();
    paintTimeline();
    chart.ended(job.status);
    const items = await listArtifacts();
    await showResults(items);
    if (job.status === "failed") await showLogTail(items);
  }

  // One refresh for a burst of checkpoints: the stream replays a job's whole history when the page opens.
  let artifactsTimer = null;
  function refreshArtifactsSoon() {
    if (artifactsTimer) return;
    artifactsTimer = setTimeout(() => {
      artifactsTimer = null;
      listArtifacts().catch(() => {});
    }, 300);
  }

  // The artifacts table: at load, at each checkpoint (train_state) and at the end.
  async function listArtifacts() {
    const { items } = await getJson(`/v1/jobs/${id}/artifacts`);
    el.artifacts.replaceChildren(items.length ? h("table", { class: "artifacts" },
      h("thead", {}, h("tr", {}, ["kind", "file", "size", "sha256", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, items.map((a) => h("tr", { "data-kind": a.kind },
        h("td", {}, a.kind), h("td", { class: "mono" }, a.filename), h("td", { class: "num" }, bytes(a.size_bytes)),
        h("td", { class: "mono", title: a.sha256 }, a.sha256.slice(0, 12)),
        h("td", {}, h("button", { "data-kind": a.kind, onclick: () => download(a) }, "Download")))))) :
      h("p", { class: "muted" }, TERMINAL.has(job?.status) ? "No artifacts." : "No artifacts yet."));
    return items;
  }

  async function showResults(items) {
    const report = items.find((a) => a.kind === "report");
    if (report) showReport(await (await request("GET", report.content_url)).json());
    const engineConfig = items.find((a) => a.kind === "config");
    if (engineConfig) {
      const text = await (await request("GET", engineConfig.content_url)).text();
      el.config.append(h("details", {}, h("summary", {}, `engine config (${engineConfig.filename})`), h("pre", {}, text)));
    }
  }

  // A failed job's story is at the end of its engine.log (the traceback); the error alone when it has none.
  async function showLogTail(items) {
    const log = items.find((a) => a.kind === "log");
    const lines = log ? (await (await request("GET", log.content_url)).text()).split(/\r?\n/).filter((l) => l.trim())
      : [];
    const tail = lines.slice(-LOG_TAIL_LINES);
    if (!tail.length && !job.error) return;
    el.log.querySelector(".empty")?.remove();
    el.logTail.replaceChildren(
      h("p", { class: "muted" }, tail.length ? `${log.filename}, last ${tail.length} of ${lines.length} lines:`
        : "The job left no engine log; its error:"),
      h("pre", { class: "log-tail" }, tail.length ? tail.join("\n") : `${job.error.type}: ${job.error.detail || ""}`));
  }

  function showReport(r) {
    el.report.replaceChildren(...reportTable(r));
    if (r.llm) {
      const c = r.llm.config;
      el.report.append(h("p", { id: "llm-config", class: "muted" },
        `${r.llm.architecture} · ${c.algorithm}, weights ${c.weights}${c.inputs ? `, activations ${c.inputs}` : ""}`
        + ` · calibrated on ${r.llm.tokens.calibration_batches} × ${r.llm.tokens.calibration_rows_per_batch} rows`
        + ` of ${r.llm.tokens.seq_len} tokens`));
    }
    if (r.sensitivity) el.report.append(h("h3", {}, "Per-layer sensitivity"), sensitivityTable(r.sensitivity));
    if (r.mixed_precision) el.report.append(h("h3", {}, "Mixed precision"), mixedPrecisionTable(r.mixed_precision));
  }

  async function showConfig() {
    const [config, dataset] = await Promise.all([getJson(`/v1/configs/${job.config_id}`).catch(() => null),
                                                 getJson(`/v1/datasets/${job.dataset_id}`).catch(() => null)]);
    const model = await getJson(`/v1/models/${job.model_id}`).catch(() => null);
    el.config.prepend(
      keyValues([
        ["model", model && `${model.name} · ${signatureText(model)}`],
        ["cfg", config && `${config.name} (${config.kind}) · sha256 ${config.sha256.slice(0, 12)}`],
        ["dataset", dataset && `${dataset.name} · ${dataset.description.samples} samples`],
        ...Object.entries(job.params).map(([k, v]) => [k, String(v)]),
      ]));
    if (config) {
      const text = await (await request("GET", `/v1/configs/${config.id}/content`)).text();
      el.config.querySelector("#cfg-text")?.remove();
      el.config.append(h("details", { id: "cfg-text", open: "" }, h("summary", {}, config.name), h("pre", {}, text)));
    }
  }

  async function onCancel() {
    cancel.disabled = true;
    try {
      job = await postJson(`/v1/jobs/${id}/cancel`);
      paint();
    } catch (err) {
      el.error.replaceChildren(h("p", { class: "error-box" }, err.message));
    }
  }

  (async () => {
    try {
      job = await getJson(`/v1/jobs/${id}`);
    } catch (err) {
      el.error.replaceChildren(h("p", { class: "error-box" }, err.message));
      return;
    }
    modelName(job.model_id).then((name) => { el.title.textContent = `${name} · ${job.kind}`; });
    paint();
    showConfig();
    listArtifacts().catch(() => {});
    // From seq 0: the stream replays the job's history (timeline, loss so far), then follows it live.
    streamEvents(`/v1/jobs/${id}/events`, onEvent, { signal: ctl.signal }).catch(() => {})
      .finally(() => { if (!ctl.signal.aborted) finish(); });
  })();
  const tick = setInterval(() => { if (job && job.status === "running") { paint(); paintTimeline(); } }, 1000);
  return { node, stop() { ctl.abort(); clearInterval(tick); } };
}
