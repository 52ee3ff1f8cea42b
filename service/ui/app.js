// The dashboard's shell: the API-key field, the banner for errors, and the hash router
// (#/ → jobs table and submit form, #/jobs/<id> → one job).

import { apiKey, getJson, setApiKey } from "./api.js";
import { jobsView } from "./jobs.js";
import { jobView } from "./job.js";
import { loadMeta } from "./meta.js";

const view = document.getElementById("view");
const banner = document.getElementById("banner");
let current = null; // the mounted view: { node, stop() }

export function showBanner(message, kind = "error") {
  banner.textContent = message;
  banner.className = `banner banner-${kind}`;
  banner.hidden = !message;
}

async function who() {
  const label = document.getElementById("who");
  label.textContent = "";
  try {
    const me = await getJson("/v1/me");
    label.textContent = `project ${me.project} · ${me.scopes.join(", ")}`;
    showBanner("");
  } catch {
    // 401/403 are shown by the amct:api-error listener below
  }
}

async function route() {
  await loadMeta(); // the job states a view needs (which ones end a job) before it is mounted
  current?.stop();
  const match = location.hash.match(/^#\/jobs\/([\w-]+)/);
  current = match ? jobView(match[1]) : jobsView();
  view.replaceChildren(current.node);
}

function setupKeyForm() {
  const form = document.getElementById("key-form");
  const input = document.getElementById("api-key");
  input.value = apiKey();
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setApiKey(input.value);
    who();
    route();
  });
}

window.addEventListener("amct:api-error", (e) => {
  const err = e.detail;
  if (err.status === 401) {
    showBanner(apiKey() ? `${err.message}: paste a valid API key above.`
      : "Paste an API key above: `make serve` printed one at its first start and saved it in <data dir>/api-key.",
    "info");
  }
  else if (err.status === 403) showBanner(err.message);
});
window.addEventListener("hashchange", route);
setupKeyForm();
who();
route();
