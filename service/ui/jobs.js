// #/ : the jobs table, live from each active job's event stream, and the form that submits a job.

import { ApiError, getJson, postForm, postJson, streamEvents } from "./api.js";
import { duration, elapsed, h, progressBar, statusChip, when } from "./dom.js";
import { TERMINAL, serverMeta } from "./meta.js";

const REFRESH_MS = 4000; // new jobs from other clients appear within this
// Browsers open about 6 HTTP/1.1 connections per host; each stream holds one, so keep some free.
const MAX_STREAMS = 4;
const modelNames = new Map(); // model id -> Promise<name>

export function modelName(id) {
  if (!modelNames.has(id)) {
    modelNames.set(id, getJson(`/v1/models/${id}`).then((m) => m.name).catch(() => id.slice(0, 8)));
  }
  return modelNames.get(id);
}

// Fold one event into a job object as GET /v1/jobs/{id} would show it after that event.
export function applyEvent(job, ev) {
  if (ev.type === "state") {
    job.status = ev.status;
    if (ev.status === "running" && !job.started_at) job.started_at = ev.ts;
    if (TERMINAL.has(ev.status)) {
      job.finished_at = job.finished_at || ev.ts;
      job.phase = null;
      if (ev.status === "succeeded") job.progress = 1;
    }
  } else if (ev.type === "phase") {
    job.phase = ev.phase;
    if (typeof ev.progress === "number") job.progress = ev.progress;
  } else if (ev.type === "progress" && typeof ev.progress === "number") {
    job.progress = ev.progress;
  }
}

function jobRow(job) {
  const bar = progressBar(job.progress);
  const cells = { status: h("td"), model: h("td"), phase: h("td", { class: "phase" }),
                  elapsed: h("td", { class: "num" }) };
  const tr = h("tr", { "data-job-id": job.id, class: "clickable", onclick: () => { location.hash = `#/jobs/${job.id}`; } },
    h("td", {}, h("a", { href: `#/jobs/${job.id}`, class: "mono" }, job.id.slice(0, 8))),
    cells.status, h("td", {}, job.kind), cells.model, h("td", {}, job.device), h("td", { class: "progress-cell" }, bar),
    cells.phase, cells.elapsed, h("td", { class: "num" }, when(job.created_at)));
  modelName(job.model_id).then((name) => { cells.model.textContent = name; });
  const row = { job, tr, cells, bar };
  paint(row);
  return row;
}

function paint(row) {
  const job = row.job;
  row.tr.dataset.status = job.status;
  row.cells.status.replaceChildren(statusChip(job.status));
  row.bar.update(job.progress, job.status);
  row.cells.phase.textContent = job.phase || (job.error ? job.error.type : "");
  row.cells.elapsed.textContent = duration(elapsed(job));
}

export function jobsView() {
  const rows = new Map(); // job id -> row
  const streams = new Map(); // job id -> AbortController
  const tbody = h("tbody");
  // Says "no jobs" only once the server said so: without a key the list is unknown, not empty.
  const empty = h("p", { class: "muted", id: "jobs-empty" }, "Loading jobs…");
  const head = ["Job", "Status", "Kind", "Model", "Device", "Progress", "Phase", "Elapsed", "Created"];
  const table = h("table", { id: "jobs", class: "jobs" }, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))),
                  tbody);
  const node = h("div", { class: "layout" },
    h("section", { class: "card grow" }, h("h2", {}, "Jobs"), table, empty),
    submitForm((job) => { upsert(job); follow(job.id); order([job.id, ...rows.keys()]); }));

  function upsert(job) {
    const row = rows.get(job.id);
    if (!row) {
      rows.set(job.id, jobRow(job));
      return;
    }
    // A list snapshot may be older than the last streamed event: progress within one attempt only grows.
    if (streams.has(job.id) && row.job.status === job.status && row.job.attempt === job.attempt) {
      job.progress = Math.max(job.progress, row.job.progress);
    }
    row.job = job;
    paint(row);
  }

  function order(ids) {
    tbody.replaceChildren(...[...new Set(ids)].map((id) => rows.get(id)?.tr).filter(Boolean));
    empty.textContent = "No jobs yet: submit one with the form.";
    empty.hidden = rows.size > 0;
  }

  function follow(id) {
    if (streams.has(id) || streams.size >= MAX_STREAMS) return;
    const ctl = new AbortController();
    streams.set(id, ctl);
    streamEvents(`/v1/jobs/${id}/events`, (ev) => {
      const row = rows.get(id);
      if (!row) return;
      applyEvent(row.job, ev);
      paint(row);
    }, { signal: ctl.signal })
      .catch(() => {})
      .finally(async () => {
        streams.delete(id);
        if (ctl.signal.aborted) return;
        try { upsert(await getJson(`/v1/jobs/${id}`)); } catch { /* the next refresh retries */ }
      });
  }

  async function refresh() {
    try {
      const page = await getJson("/v1/jobs?limit=50");
      for (const job of page.items) upsert(job);
      order(page.items.map((j) => j.id));
      for (const job of page.items) if (!TERMINAL.has(job.status)) follow(job.id);
    } catch (err) {
      // The banner says what to do (401/403); the next tick retries.
      if (err instanceof ApiError && (err.status === 401 || err.status === 403) && !rows.size) {
        empty.textContent = err.status === 401 ? "Paste this project's API key above to see its jobs."
          : "This key may not list jobs.";
        empty.hidden = false;
      }
    }
  }

  refresh();
  const timers = [setInterval(refresh, REFRESH_MS),
                  setInterval(() => rows.forEach((row) => { if (row.job.status === "running") paint(row); }), 1000)];
  return {
    node,
    stop() {
      timers.forEach(clearInterval);
      streams.forEach((ctl) => ctl.abort());
    },
  };
}

// -- the submit form ------------------------------------------------------------------------------------

function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", {}, label), input, hint ? h("small", {}, hint) : null);
}

// A select the server's choices fill in; empty (and so, being required, unsubmittable) until then.
function select(name) {
  return h("select", { name, required: true });
}

function fill(sel, options, value, title = () => "") {
  sel.replaceChildren(...options.map((o) => h("option", { value: o, selected: o === value, title: title(o) }, o)));
}

function randomKey() {
  // crypto.randomUUID needs a secure context; getRandomValues works on plain http too.
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

function multipart(fields) {
  const fd = new FormData();
  for (const [k, v] of Object.entries(fields)) if (v !== undefined && v !== null && v !== "") fd.append(k, v);
  return fd;
}

// Which input to mark when a step's problem names a field (a signature's problem names `inputs[0].dtype`, …).
const FIELD_INPUTS = { model: { file: "model" }, cfg: { file: "cfg" }, dataset: { file: "dataset" },
                       job: { model_id: "model", config_id: "cfg", dataset_id: "dataset" } };
function inputFor(step, field) {
  if (field && field.startsWith("inputs")) return "inputs";
  return FIELD_INPUTS[step]?.[field] || field || (step === "job" ? "" : step);
}

const SIGNATURE_EXAMPLE = '[{"name": "input_ids", "shape": ["batch", 128], "dtype": "int64"}, …]';

// The job's optional numbers: an empty field is left out of the request, so the server's default holds.
function optionalNumber(values, name) {
  const text = values.get(name);
  return text === null || text === "" ? undefined : Number(text);
}

function submitForm(onSubmitted) {
  const status = h("p", { class: "form-status", id: "submit-status", role: "status" });
  const kindHint = h("span", { id: "kind-description" }); // the chosen kind's description, from the server
  const num = (name, value, attrs = {}) => h("input", { name, type: "number", value, required: true, ...attrs });
  const form = h("form", { id: "submit-form", class: "card submit" },
    h("h2", {}, "New job"),
    field("Model (TorchScript)", h("input", { type: "file", name: "model", required: true })),
    field("Input shape", h("input", { name: "input_shape", placeholder: "1,1,28,28",
                                      pattern: "\\s*\\d+(\\s*[,x]\\s*\\d+)*\\s*" }),
          "one float input, batch first, e.g. 1,3,224,224"),
    field("or signature (inputs, JSON)", h("textarea", { name: "inputs", rows: 3, spellcheck: "false",
                                                        placeholder: SIGNATURE_EXAMPLE }),
          "inputs by name in forward's order: shape (axis names are dynamic), dtype float32 | int64 | …"),
    field("Config (.cfg)", h("input", { type: "file", name: "cfg", required: true })),
    field("Dataset (.npz / .safetensors)", h("input", { type: "file", name: "dataset", required: true }),
          "one array per input (or inputs), optional labels"),
    field("Kind", select("kind"), kindHint),
    h("div", { class: "row" },
      field("Epochs", num("epochs", 1, { min: 1, max: 1000 })),
      field("Batch size", num("batch_size", 64, { min: 1 })),
      field("Learning rate", num("lr", 0.001, { min: 0, step: "any" }))),
    h("div", { class: "row" },
      field("Objective", h("select", { name: "objective" })),
      field("Distill loss", select("distill_loss")),
      field("Temperature", num("temperature", 4, { min: 0, max: 100, step: "any" })),
      field("KD share", num("distill_alpha", 1, { min: 0, max: 1, step: "any" }),
            "distill_outputs with labels: alpha·KD + (1 − alpha)·cross-entropy")),
    h("div", { class: "row" },
      field("Max top-1 drop", h("input", { name: "max_accuracy_drop", type: "number", min: 0, max: 1, step: "any",
                                           placeholder: "off" }), "quality gate, e.g. 0.02"),
      field("Min output cosine", h("input", { name: "min_output_cosine", type: "number", min: -1, max: 1,
                                              step: "any", placeholder: "off" }), "quality gate, e.g. 0.99")),
    h("div", { class: "row" },
      field("Device", select("device")),
      field("Held-out share", num("eval_fraction", 0.1, { min: 0, max: 0.99, step: "any" })),
      field("Deploy format", select("deploy_format")),
      field("Deploy CPU", select("deploy_target"))),
    h("button", { type: "submit", class: "primary" }, "Upload and submit"),
    status);

  const say = (text, kind = "info") => { status.textContent = text; status.className = `form-status ${kind}`; };
  const input = (name) => form.elements.namedItem(name);

  let kinds = new Map(); // job kind name -> { cfg_kind, needs_labels, description }
  const describeKind = () => { kindHint.textContent = kinds.get(input("kind").value)?.description || ""; };
  serverMeta().then((meta) => {
    kinds = new Map(meta.job_kinds.map((k) => [k.name, k]));
    fill(input("kind"), [...kinds.keys()], meta.defaults.kind, (name) => kinds.get(name).description);
    fill(input("device"), meta.devices, meta.defaults.device);
    const formats = new Map(meta.deploy_formats.map((f) => [f.name, f.summary]));
    fill(input("deploy_format"), [...formats.keys()], meta.defaults.deploy_format, (name) => formats.get(name));
    fill(input("deploy_target"), meta.deploy_targets, meta.defaults.deploy_target);
    // No objective: the server picks (cross_entropy with labels, else distill_outputs).
    fill(input("objective"), ["", ...meta.objectives], "",
         (name) => (name ? "" : "cross_entropy when the dataset has labels, else distill_outputs"));
    input("objective").options[0].textContent = "default";
    fill(input("distill_loss"), meta.distill_losses, meta.defaults.distill_loss);
    describeKind();
  }).catch(() => {}); // a 401 is shown by the banner; the key form rebuilds this view
  input("kind").addEventListener("change", describeKind);

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const values = new FormData(form);
    const button = form.querySelector("button[type=submit]");
    form.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
    button.disabled = true;
    let step = "model";
    try {
      say("Uploading the model (the server loads and checks it)…");
      const model = await postForm("/v1/models", multipart({ file: values.get("model"), name: values.get("model").name,
                                                             input_shape: values.get("input_shape"),
                                                             inputs: values.get("inputs").trim() }));
      step = "cfg";
      say("Uploading the config…");
      const kind = values.get("kind");
      const cfg = await postForm("/v1/configs", multipart({ file: values.get("cfg"), kind: kinds.get(kind).cfg_kind }));
      step = "dataset";
      say("Uploading the dataset…");
      const data = await postForm("/v1/datasets", multipart({ file: values.get("dataset") }));
      step = "job";
      const job = await postJson("/v1/jobs", {
        kind, model_id: model.id, config_id: cfg.id, dataset_id: data.id,
        epochs: Number(values.get("epochs")), batch_size: Number(values.get("batch_size")),
        lr: Number(values.get("lr")), device: values.get("device"),
        eval_fraction: Number(values.get("eval_fraction")), deploy_format: values.get("deploy_format"),
        deploy_target: values.get("deploy_target"), objective: values.get("objective") || undefined,
        distill_loss: values.get("distill_loss"), temperature: Number(values.get("temperature")),
        distill_alpha: Number(values.get("distill_alpha")),
        max_accuracy_drop: optionalNumber(values, "max_accuracy_drop"),
        min_output_cosine: optionalNumber(values, "min_output_cosine"),
      }, { headers: { "Idempotency-Key": randomKey() } });
      say(`Submitted job ${job.id.slice(0, 8)}: ${job.status}.`, "ok");
      onSubmitted(job);
    } catch (err) {
      say(`${step === "job" ? "Submit" : `Upload of the ${step}`} failed: ${err.message}`, "error");
      const target = input(inputFor(step, err.field));
      if (target instanceof HTMLElement) {
        target.setAttribute("aria-invalid", "true");
        target.focus();
      }
    } finally {
      button.disabled = false;
    }
  });
  return form;
}
