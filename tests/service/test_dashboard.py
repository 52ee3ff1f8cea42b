"""The dashboard at /ui: static files of our own, and a real browser driving it against a live server.

The browser test drives Debian's Chromium (`/usr/bin/chromium`, headless) with Playwright; it never
downloads a browser. `AMCT_UPDATE_SCREENSHOTS=1` also writes the screenshots the README shows.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import onnx
import pytest
import torch
from fastapi.testclient import TestClient

from job_process.quality_gate import speedups as report_speedups
from service.client import AmctClient
from tests.service.app_server import AppServer
from tests.service.support import QUANT_CFG, ROOT, make_settings, open_api, wait_until
from tests.signature_models import TinyEncoder, token_data

CHROMIUM = Path("/usr/bin/chromium")
DOCS_IMAGES = ROOT / "docs" / "images"
# Records every value the jobs table's progress bars take, per job, as the page updates them.
RECORD_PROGRESS = """() => {
  window.__progress = {};
  new MutationObserver((records) => {
    for (const r of records) {
      const id = r.target.closest("tr")?.dataset.jobId;
      if (id) (window.__progress[id] ||= []).push(Number(r.target.getAttribute("aria-valuenow")));
    }
  // The whole view: pasting the key mounts the jobs view again once /v1/meta answers, maybe after this.
  }).observe(document.querySelector("#view"), { subtree: true, attributes: true,
                                                attributeFilter: ["aria-valuenow"] });
}"""


def test_dashboard_files_are_public_and_hold_no_key(tmp_path):
    with open_api(make_settings(tmp_path)) as client:
        bare = TestClient(client.app)  # the same app, no Authorization header
        root = bare.get("/", follow_redirects=False)
        assert root.status_code == 307 and root.headers["location"] == "/ui/"
        page = bare.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        key = (tmp_path / "api-key").read_text().strip()
        for name in ("", "app.js", "api.js", "jobs.js", "job.js", "chart.js", "dom.js", "style.css"):
            body = bare.get(f"/ui/{name}")
            assert body.status_code == 200, name
            assert key not in body.text and "amct_" not in body.text.replace("amct_…", "")
        assert bare.get("/ui/app.js").headers["content-type"].startswith(("text/javascript", "application/javascript"))
        assert bare.get("/v1/jobs").status_code == 401  # the data behind it is not public


def _save(page, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("AMCT_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMAGES / name)


@pytest.fixture
def page(tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium): apt-get install chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        yield page
        context.close()
        browser.close()


@pytest.mark.slow
def test_browser_submits_a_job_watches_it_and_downloads_the_deploy_onnx(live_server, assets, page, tmp_path):
    page.goto(live_server.base_url)
    assert page.url.endswith("/ui/")
    page.locator("#banner", has_text="Paste an API key").wait_for()  # without a key the API answers 401
    page.fill("#api-key", live_server.api_key)
    page.click("#key-form button")
    page.locator("#who", has_text="project default").wait_for()

    page.evaluate(RECORD_PROGRESS)
    form = page.locator("#submit-form")
    form.locator("[name=model]").set_input_files(str(assets / "cnn.pt"))
    form.locator("[name=input_shape]").fill("1,1,28,28")
    form.locator("[name=cfg]").set_input_files(str(assets / "quant.cfg"))
    form.locator("[name=dataset]").set_input_files(str(assets / "small.npz"))
    form.locator("[name=kind]").select_option("compressed_retrain")
    form.locator("[name=epochs]").fill("2")
    form.locator("[name=batch_size]").fill("16")
    form.locator("[name=eval_fraction]").fill("0.25")
    form.locator("button[type=submit]").click()
    page.locator("#submit-status", has_text="Submitted job").wait_for(timeout=60_000)
    job_id = page.locator("#jobs tbody tr").first.get_attribute("data-job-id")
    row = page.locator(f'#jobs tr[data-job-id="{job_id}"]')
    # The screenshot for the README: the job mid-way, most often while it trains.
    page.wait_for_function(
        "id => Number(document.querySelector(`tr[data-job-id='${id}'] [role=progressbar]`)"
        ".getAttribute('aria-valuenow')) >= 15",
        arg=job_id,
        timeout=90_000,
    )
    _save(page, tmp_path, "dashboard.png")
    row.locator(".status-succeeded").wait_for(timeout=90_000)
    assert row.locator("[role=progressbar]").get_attribute("aria-valuenow") == "100"

    # The bar moved with the job's events: it only grew, through values between the ends.
    seen = page.evaluate("id => window.__progress[id] || []", job_id)
    assert seen == sorted(seen), seen
    assert len({v for v in seen if 0 < v < 100}) >= 3 and seen[-1] == 100, seen

    row.locator("a").click()
    page.wait_for_url(f"**/ui/#/jobs/{job_id}")
    page.locator("#report-table tbody tr").nth(4).wait_for()
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {live_server.api_key}"}) as api:
        artifacts = {a["kind"]: a for a in api.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]}
        report = api.get(artifacts["report"]["content_url"]).json()
    table = page.locator("#report-table tbody tr")
    accuracy = table.filter(has_text="accuracy").locator("td")
    assert accuracy.nth(0).inner_text() == f"{report['accuracy']['fp32']:.4f}"
    assert accuracy.nth(1).inner_text() == f"{report['accuracy']['deploy']:.4f}"
    latency = table.filter(has_text="latency").locator("td")
    assert latency.nth(1).inner_text() == f"{report['latency_ms']['deploy']['median']:.3f} ms"
    deploy_cpu = table.filter(has_text="deploy CPU").locator("td")  # what "auto" resolved to on the worker
    assert deploy_cpu.nth(1).inner_text() == report["deploy"]["deploy_target"]
    # A deploy model slower than FP32 (this 20k-parameter CNN often is at small batches) gets a yellow row with
    # its figure; a faster one none.
    warned = page.locator("#report-table tr.warning")
    slower = {batch: x for batch, x in report_speedups(report["latency_ms"]).items() if x < 1}
    assert warned.count() == len(report["warnings"]) and sum("slower" in w for w in report["warnings"]) == len(slower)
    for batch, speedup in slower.items():  # each batch the deploy model lost at, with its figure
        warned.filter(has_text=f"{speedup:.2f}x its speed at batch {batch}").wait_for()
    latency_rows = table.filter(has_text="latency, median")
    assert latency_rows.count() == 1 + len(report["latency_ms"]["other_batches"])  # batch 1, and 8

    points = int(page.locator("#loss-curve").get_attribute("data-points"))
    assert points >= 2
    assert page.locator("#loss-curve polyline").get_attribute("points").count(",") == points
    phases = page.locator("#timeline li").evaluate_all("items => items.map(li => li.dataset.phase)")
    assert phases[:2] == ["queued", "running"] and "training" in phases and phases[-1] == "succeeded"
    page.locator("#frozen-config", has_text="epochs").wait_for()
    page.locator("#cfg-text pre", has_text="arq_retrain { channel_wise: true dst_type: INT8 }").wait_for()
    assert page.locator("#cancel").is_disabled()

    with page.expect_download() as download:
        page.click('#artifacts button[data-kind="deploy"]')
    saved = tmp_path / "deploy.onnx"
    download.value.save_as(saved)
    assert saved.stat().st_size == artifacts["deploy"]["size_bytes"]
    onnx.checker.check_model(onnx.load(saved))
    _save(page, tmp_path, "job.png")
    assert page.errors == []


# Two int64 inputs, `seq` dynamic (tests/service/test_signatures.py uploads the same model through the API).
TOKENS = [
    {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
    {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64"},
]
RED = "rgb(194, 53, 43)"  # style.css --bad


def _encoder_files(folder: Path) -> dict[str, Path]:
    torch.manual_seed(0)
    example = token_data(2)
    ids, mask = torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"])
    torch.jit.trace(TinyEncoder().eval(), (ids, mask)).save(str(folder / "encoder.pt"))
    np.savez(folder / "tokens.npz", **token_data(96, seed=1))  # no labels
    (folder / "quant.cfg").write_bytes(QUANT_CFG)
    return {"model": folder / "encoder.pt", "dataset": folder / "tokens.npz", "cfg": folder / "quant.cfg"}


def _color(locator) -> str:
    return locator.evaluate("el => getComputedStyle(el).color")


@pytest.mark.slow
def test_the_form_sends_a_signature_an_objective_and_gate_limits_and_a_missed_gate_shows_red(
    live_server, page, tmp_path
):
    files = _encoder_files(tmp_path)
    _open_with_key(page, live_server, "#/")
    form = page.locator("#submit-form")
    form.locator("[name=objective] option[value=distill_outputs]").wait_for(state="attached")  # from /v1/meta
    for name, path in files.items():
        form.locator(f"[name={name}]").set_input_files(str(path))
    form.locator("[name=inputs]").fill(json.dumps(TOKENS))
    form.locator("[name=kind]").select_option("quant_retrain")
    form.locator("[name=batch_size]").fill("32")
    form.locator("[name=eval_fraction]").fill("0.25")
    form.locator("[name=objective]").select_option("distill_outputs")
    form.locator("[name=distill_loss]").select_option("cosine")
    form.locator("[name=temperature]").fill("2")
    form.locator("[name=min_output_cosine]").fill("0.9999")  # INT8 cannot hold that: the gate fails
    # Top-1 needs labels, which token data lacks: the API's 422 names the field, the form marks it.
    form.locator("[name=max_accuracy_drop]").fill("0.05")
    form.locator("button[type=submit]").click()
    page.locator("#submit-status.error", has_text="max_accuracy_drop").wait_for(timeout=90_000)
    assert form.locator("[name=max_accuracy_drop]").get_attribute("aria-invalid") == "true"

    form.locator("[name=max_accuracy_drop]").fill("")
    # So does a KD + cross-entropy mix: the labels it would weigh are missing.
    form.locator("[name=distill_alpha]").fill("0.5")
    form.locator("button[type=submit]").click()
    page.locator("#submit-status.error", has_text="distill_alpha").wait_for(timeout=90_000)
    assert form.locator("[name=distill_alpha]").get_attribute("aria-invalid") == "true"

    form.locator("[name=distill_alpha]").fill("1")
    form.locator("button[type=submit]").click()
    page.locator("#submit-status.ok", has_text="Submitted job").wait_for(timeout=90_000)
    job_id = page.locator("#jobs tbody tr").first.get_attribute("data-job-id")
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {live_server.api_key}"}) as api:
        job = api.get(f"/v1/jobs/{job_id}").json()
        assert job["kind"] == "quant_retrain"
        assert {
            k: job["params"].get(k)
            for k in (
                "objective",
                "distill_loss",
                "temperature",
                "min_output_cosine",
                "max_accuracy_drop",
                "batch_size",
            )
        } == {
            "objective": "distill_outputs",
            "distill_loss": "cosine",
            "temperature": 2.0,
            "min_output_cosine": 0.9999,
            "max_accuracy_drop": None,
            "batch_size": 32,
        }
        model = api.get(f"/v1/models/{job['model_id']}").json()
        assert model["inputs"] == TOKENS  # the two-input signature, from the form's textarea
        assert model["outputs"] == {"type": "tensor", "shape": [2, 16], "dtype": "float32"}

        row = page.locator(f'#jobs tr[data-job-id="{job_id}"]')
        row.locator(".status-failed").wait_for(timeout=240_000)
        job = api.get(f"/v1/jobs/{job_id}").json()
        assert job["error"]["type"] == "quality_gate" and "min_output_cosine 0.9999" in job["error"]["detail"], job
        artifacts = {a["kind"]: a for a in api.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]}
        report = api.get(artifacts["report"]["content_url"]).json()  # kept: the gate failed after training
    cosine = f"{report['outputs']['output']['deploy']['mean_cosine']:.4f}"

    # Its page: red, with the figures the job missed its limit by.
    row.locator("a").click()
    page.wait_for_url(f"**/ui/#/jobs/{job_id}")
    gate = page.locator("#report-table tr.gate-failed")
    gate.wait_for()  # the report comes once the replayed events have ended: the page no longer repaints
    assert _color(page.locator(".head .status-failed")) == RED
    error = page.locator(".head .error-box")
    assert f"quality_gate: output 'output': mean cosine of the deploy model to FP32 is {cosine}" in error.inner_text()
    assert _color(error) == RED
    assert "FAILED" in gate.inner_text() and f"{cosine} < min_output_cosine 0.9999" in gate.inner_text()
    assert _color(gate.locator("td").first) == RED
    shown = page.locator("#report-table tr", has_text="output cosine with FP32").locator("td").nth(1)
    assert shown.inner_text() == cosine
    page.locator("#frozen-config", has_text="distill_outputs").wait_for()
    assert page.errors == []


# -- offline API docs, the chart, failed and running jobs ------------------------------------------------------

LOCAL_HOSTS = ("127.0.0.1", "localhost")
# Every y label's box inside the chart's viewBox, on both scales; the labels' texts.
CHART_LABELS = """async (losses) => {
  const { lossChart } = await import("/ui/chart.js");
  const chart = lossChart();
  const box = document.createElement("div");
  box.style.width = "420px";
  box.append(chart);
  document.body.append(box);
  losses.forEach((loss, i) => chart.add({ step: i + 1, total_steps: losses.length, loss }));
  const svg = chart.querySelector("#loss-curve");
  const measure = () => {
    const [,, width, height] = svg.getAttribute("viewBox").split(" ").map(Number);
    return [...svg.querySelectorAll("text.tick")].map((t) => {
      const b = t.getBBox();
      const inside = b.x >= 0 && b.y >= 0 && b.x + b.width <= width && b.y + b.height <= height;
      return { text: t.textContent, inside };
    });
  };
  const linear = measure();
  chart.querySelector("#loss-scale").click();
  const log = measure();
  return { linear, log, scale: svg.dataset.scale };
}"""


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    server = AppServer(tmp_path_factory.mktemp("dashboard-app"))
    yield server
    server.stop()


def _offline(page) -> list[str]:
    """Abort every request to another host, as on an air-gapped machine; returns the list of those asked for."""
    asked: list[str] = []

    def route(r):
        if urlsplit(r.request.url).hostname in LOCAL_HOSTS:
            r.continue_()
        else:
            asked.append(r.request.url)
            r.abort()

    page.context.route("**/*", route)
    return asked


def test_the_api_docs_render_offline_from_the_dashboards_api_link(app_server, page):
    asked = _offline(page)
    spec = httpx.get(f"{app_server.base_url}/openapi.json").json()
    operations = {(method.upper(), path) for path, item in spec["paths"].items() for method in item}

    page.goto(f"{app_server.base_url}/ui/")
    page.click("header nav a:text-is('API')")
    page.wait_for_url("**/docs")
    page.locator(".opblock").first.wait_for()
    shown = page.locator(".opblock").evaluate_all(
        "blocks => blocks.map(b => [b.querySelector('.opblock-summary-method').textContent,"
        " b.querySelector('.opblock-summary-path').dataset.path])"
    )
    assert {tuple(op) for op in shown} == operations

    page.goto(f"{app_server.base_url}/redoc")
    page.locator("[data-section-id*='/operation/']").first.wait_for()
    assert page.locator("li[data-item-id*='/operation/']").count() == len(operations)
    page.locator("h2", has_text="Submit Job").first.wait_for()
    assert asked == [] and page.errors == []


def test_the_loss_chart_labels_fit_for_a_loss_of_1e5_on_both_scales(app_server, page):
    page.goto(f"{app_server.base_url}/ui/")
    result = page.evaluate(CHART_LABELS, [100000.0, 94612.532, 61234.5, 20000.25, 5000.0])
    assert result["scale"] == "log"
    for scale in ("linear", "log"):
        labels = result[scale]
        assert len(labels) == 5 and all(label["inside"] for label in labels), (scale, labels)
        assert len({label["text"] for label in labels}) == 5, labels  # neighbouring ticks told apart
    top = max(float(label["text"]) for label in result["linear"])
    assert top > 100000  # the whole number, not its last digits
    assert page.errors == []


def _open_with_key(page, server, hash_: str) -> None:
    page.goto(f"{server.base_url}/ui/")
    page.evaluate("key => localStorage.setItem('amct.apiKey', key)", server.api_key)
    page.goto(f"{server.base_url}/ui/{hash_}")


def _upload_sample(client, assets) -> dict:
    return {
        "model_id": client.upload_model(assets / "cnn.pt", "1,1,28,28")["id"],
        "config_id": client.upload_config(assets / "quant.cfg")["id"],
        "dataset_id": client.upload_dataset(assets / "small.npz")["id"],
    }


@pytest.mark.slow
def test_a_failed_jobs_page_shows_its_log_and_offers_no_cancel(live_server, assets, page):
    with AmctClient(live_server.base_url, live_server.api_key) as client:
        ids = _upload_sample(client, assets)
        # The worker has no torch_npu: the job fails while preparing, before any training step.
        job = client.wait(client.submit("quant_retrain", device="npu", **ids)["id"])
        log = next(a for a in client.artifacts(job["id"]) if a["kind"] == "log")
        last_line = [line for line in client.artifact_bytes(log).decode().splitlines() if line.strip()][-1]
    assert job["status"] == "failed" and "torch_npu" in last_line

    _open_with_key(page, live_server, f"#/jobs/{job['id']}")
    page.locator(".head .status-failed").wait_for()
    tail = page.locator("#log-tail pre")
    tail.wait_for()
    assert tail.inner_text().rstrip().endswith(last_line.strip())  # the error's last lines, the traceback's end
    assert "No log lines." not in page.locator("#log").inner_text()
    assert page.locator("#cancel").is_hidden()
    chart = page.locator("#loss-curve").text_content()
    assert "waiting for the first training step" not in chart and "failed before its first" in chart
    assert page.errors == []

    # Without a key, the jobs page asks for one; it does not claim there are no jobs.
    bare = page.context.browser.new_context().new_page()
    bare.goto(f"{live_server.base_url}/ui/")
    bare.locator("#jobs-empty", has_text="Paste this project's API key").wait_for()
    assert "No jobs yet" not in bare.locator("main").inner_text()
    bare.context.close()


@pytest.mark.slow
def test_the_artifacts_panel_lists_train_state_while_the_job_runs(live_server, assets, page):
    with AmctClient(live_server.base_url, live_server.api_key) as client:
        ids = _upload_sample(client, assets)
        # Long enough to be cancelled while it trains; each epoch end stores a train_state.
        job_id = client.submit("quant_retrain", epochs=300, batch_size=16, **ids)["id"]
        try:
            _open_with_key(page, live_server, f"#/jobs/{job_id}")
            # The first epoch's train_state: seconds on an idle machine, minutes on 2 loaded cores.
            try:
                page.locator('#artifacts tr[data-kind="train_state"]').wait_for(timeout=300_000)
            except Exception as e:
                job = client.get(job_id)
                raise AssertionError(
                    f"no train_state row; job {job['status']} {job['phase']} "
                    f"{job['progress']}:\n{live_server.log_text()}"
                ) from e
            assert client.get(job_id)["status"] == "running"
            assert page.locator("#cancel").is_enabled()
        finally:
            client.cancel(job_id)
        wait_until(lambda: client.get(job_id)["status"] == "cancelled", 60, what="the job is cancelled")
    page.locator(".head .status-cancelled").wait_for()
    assert page.locator("#cancel").is_hidden()
    assert page.errors == []


SEARCH_TABLES = """async ([sensitivity, mixed]) => {
  const { sensitivityTable, mixedPrecisionTable } = await import("/ui/job.js");
  const table = sensitivityTable(sensitivity);
  const precision = mixedPrecisionTable(mixed);
  document.body.append(table, precision);
  return {
    rows: [...table.querySelectorAll("tbody tr")].map((tr) => [...tr.children].map((c) => c.textContent)),
    bars: [...table.querySelectorAll(".fill")].map((f) => f.style.width),
    precisions: [...precision.querySelectorAll("tbody tr")].map((tr) => [...tr.children].map((c) => c.textContent)),
    summary: precision.querySelector("p").textContent,
  };
}"""


def test_the_job_page_draws_the_sensitivity_bars_and_the_chosen_precisions(app_server, page):
    """report.json's `sensitivity` and `mixed_precision` sections (job_process/search_runners.py) as tables."""
    row = {"layer_type": "Conv2d", "cosine": 0.99, "mse": 0.1, "macs_share": 0.5, "bytes_share": 0.25}
    sensitivity = {
        "fp32_top1": 0.9,
        "rows": [
            {**row, "layer": "fc", "variant": "INT4", "top1_drop": 4.0, "damage": 4.0},
            {**row, "layer": "conv1", "variant": "INT4", "top1_drop": 1.0, "damage": 1.0},
            {**row, "layer": "conv2", "variant": "INT8", "top1_drop": -0.5, "damage": -0.5},
        ],
    }
    deviation = {"top1_drop": 0.3, "cosine": 0.998, "mse": 0.1}
    mixed = {
        "budget": {"max_top1_drop": 0.5},
        "deployed": deviation,
        "int8_deployed": {**deviation, "top1_drop": 0.0},
        "weight_bytes": 10216,
        "int8_weight_bytes": 20432,
        "precisions": {"conv1": "INT4", "fc": "INT8"},
    }
    page.goto(f"{app_server.base_url}/ui/")
    result = page.evaluate(SEARCH_TABLES, [sensitivity, mixed])
    assert [r[:3] for r in result["rows"]] == [
        ["fc", "INT4", "4.00 pts"],
        ["conv1", "INT4", "1.00 pts"],
        ["conv2", "INT8", "-0.50 pts"],
    ]
    assert result["rows"][0][4:] == ["50.0 %", "25.0 %"]
    assert result["bars"] == ["100%", "25%", "0%"]
    assert result["precisions"] == [["conv1", "INT4"], ["fc", "INT8"]]
    assert "budget max_top1_drop 0.5" in result["summary"] and "0.30 pts" in result["summary"]
    assert page.errors == []


REPORT_TABLE = """async (report) => {
  const { reportTable } = await import("/ui/job.js");
  document.body.append(...reportTable(report));
  return [...document.querySelectorAll("#report-table tr.warning")].map((tr) => ({
    text: tr.textContent, background: getComputedStyle(tr).backgroundColor,
  }));
}"""


def test_a_deploy_model_slower_than_fp32_gets_a_yellow_row_with_its_figure(app_server, page):
    """The report of a job whose deploy model lost at batch 8 (as job_process/quality_gate.py words it), drawn by
    the job page's own table code: one warning row, coloured, with the figure."""
    from job_host.spec import JobParams
    from job_process.quality_gate import warnings

    timed = {"fp32": {"median": 0.13, "batch": 1}, "deploy": {"median": 0.06, "batch": 1}, "speedup": 2.17}
    batch8 = {"batch": 8, "fp32": {"median": 0.8, "batch": 8}, "deploy": {"median": 1.0, "batch": 8}, "speedup": 0.8}
    report = {
        "onnx_size_bytes": {"fp32": 1000, "deploy": 300},
        "parameters": {"fp32": 100, "deploy": 100},
        "eval": {"split": "held_out", "samples": 100},
        "accuracy": {"fp32": 0.9, "deploy": 0.9},
        "outputs": {},
        "latency_ms": {**timed, "other_batches": [batch8]},
    }
    report["warnings"] = warnings(report, JobParams())
    page.goto(f"{app_server.base_url}/ui/")
    rows = page.evaluate(REPORT_TABLE, report)
    assert len(rows) == 1 and "0.80x its speed at batch 8" in rows[0]["text"], rows
    assert rows[0]["background"] not in ("rgba(0, 0, 0, 0)", "transparent"), rows  # the stylesheet colours it
    assert page.errors == []


# -- the dashboard -------------------------------------------------------------------------------------------------
REPORT_TABLE_ROWS = """async (report) => {
  const { reportTable } = await import("/ui/job.js");
  document.body.append(...reportTable(report));
  return [...document.querySelectorAll("#report-table tbody tr")]
    .map((tr) => [...tr.children].map((c) => c.textContent));
}"""
# report.json of an llm_quant job (job_process/llm_runner.py), as test_llm_quant_jobs.py's int4 job wrote it.
LLM_REPORT = {
    "kind": "llm_quant",
    "llm": {
        "source": "hf_folder",
        "architecture": "LlamaForCausalLM",
        "config": {"algorithm": "awq", "weights": "int4 asymmetric group 32", "batch_num": 2},
        "tokens": {
            "text_tokens": 31470,
            "seq_len": 64,
            "calibration_rows": 393,
            "evaluation_rows": 98,
            "evaluation_tokens": 6272,
            "calibration_batches": 2,
            "calibration_rows_per_batch": 8,
        },
        "perplexity": {
            "fp32": {"pytorch": 508.765, "onnxruntime": 508.7652},
            "deploy": {"pytorch": 508.974, "onnxruntime": 508.963},
            "increase": 0.00041,
            "ort_vs_pytorch": -0.00002,
        },
        "onnx_size_bytes": {"fp32": 873329, "deploy": 593015},
        "size_ratio": 0.679,
        "prefill": {
            "tokens": 64,
            "threads": 1,
            "fp32": {"median_ms": 0.54, "min_ms": 0.5, "tokens_per_s": 118518.5},
            "deploy": {"median_ms": 0.86, "min_ms": 0.8, "tokens_per_s": 74418.6},
            "speedup": 0.628,
        },
    },
}


def test_the_job_page_shows_an_llm_report_as_the_cli_does(app_server, page):
    """The dashboard's before/after table of an llm_quant report: perplexity in PyTorch and onnxruntime, bytes,
    prefill latency and tokens per second; the same rows `amct jobs watch` prints (service/report_view.py)."""
    from service.report_view import report_rows

    page.goto(f"{app_server.base_url}/ui/")
    rows = page.evaluate(REPORT_TABLE_ROWS, LLM_REPORT)
    assert [row[0] for row in rows] == [row[0] for row in report_rows(LLM_REPORT)]
    by_label = {row[0]: row[1:] for row in rows}
    assert by_label["ONNX size"] == ["852.9 KiB", "579.1 KiB", "0.68×"]
    assert by_label["perplexity, onnxruntime (6,272 held-out tokens)"] == ["508.765", "508.963", "+0.04%"]
    assert by_label["prefill, median (64 tokens, 1 thread)"] == ["0.54 ms", "0.86 ms", "speed-up 0.63×"]
    assert by_label["prefill tokens per second"][:2] == ["118,519", "74,419"]
    python = {row[0]: list(row[1:]) for row in report_rows(LLM_REPORT)}
    assert (
        by_label["perplexity, PyTorch (6,272 held-out tokens)"] == python["perplexity, PyTorch (6,272 held-out tokens)"]
    )
    assert by_label["ONNX size"] == python["ONNX size"]
    assert page.errors == []


def test_the_job_page_shows_a_pruned_transformers_heads_and_both_lengths_as_the_cli_does(app_server, page):
    """A compressed_retrain report of a token model (job_process/runners.py's `pruning` section; latency at the
    dataset's length and at 128 tokens): the dashboard draws the rows `amct jobs watch` prints, figure for figure."""
    from service.report_view import report_rows

    def timed(batch, fp32, deploy, size=None):
        row = {"fp32": {"median": fp32, "batch": batch}, "deploy": {"median": deploy, "batch": batch}}
        return {**row, "speedup": fp32 / deploy, **({"size": size} if size else {})}

    report = {
        "onnx_size_bytes": {"fp32": 90_400_000, "deploy": 18_100_000},
        "parameters": {"original": 22_700_000, "fp32": {}, "deploy": {"total": 17_300_000}},
        "eval": {"split": "held_out", "samples": 178},
        "accuracy": {"fp32": 0.9775, "deploy": 0.9663},
        "pruning": {
            "heads": {"groups": 6, "before": 72, "after": 36},
            "channels": {"groups": 6, "before": 9216, "after": 4608},
        },
        "outputs": {"output": {"deploy": {"top1_agreement": 0.989, "mean_cosine": 0.99}}},
        "latency_ms": {
            **timed(2, 30.0, 11.0),
            "lengths": {"input_ids": 64},
            "other_batches": [{"batch": 8, **timed(8, 120.0, 42.5)}],
            "other_lengths": [timed(2, 61.0, 15.0, size=128)],
        },
    }
    page.goto(f"{app_server.base_url}/ui/")
    rows = page.evaluate(REPORT_TABLE_ROWS, report)
    assert rows == [list(row) for row in report_rows(report)]
    by_label = {row[0]: row[1:] for row in rows}
    assert by_label["attention heads"] == ["72", "36", "0.50×"]
    assert by_label["channels (filters, FFN neurons)"] == ["9,216", "4,608", "0.50×"]
    assert by_label["latency, median (batch 2, 64 tokens)"][2] == "speed-up 2.73×"
    assert by_label["latency, median (batch 2, 128 tokens)"] == ["61.000 ms", "15.000 ms", "speed-up 4.07×"]
    assert page.errors == []
