// The dashboard's only door to the server: fetch with the API key, problem+json errors, the SSE reader.

const KEY_STORE = "amct.apiKey";

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key.trim());
  else localStorage.removeItem(KEY_STORE);
}

function headers(extra) {
  const h = new Headers(extra || {});
  const key = apiKey();
  if (key) h.set("Authorization", `Bearer ${key}`);
  return h;
}

// An RFC 9457 problem from the API, with the field at fault when the server named one.
export class ApiError extends Error {
  constructor(status, problem) {
    const field = problem.field ? ` (${problem.field})` : "";
    super(`${problem.detail || problem.title || `HTTP ${status}`}${field}`);
    this.status = status;
    this.problem = problem;
    this.field = problem.field || null;
  }
}

async function check(response) {
  if (response.ok) return response;
  let problem;
  try {
    problem = await response.json();
  } catch {
    problem = { title: response.statusText, detail: `HTTP ${response.status}` };
  }
  const error = new ApiError(response.status, problem);
  window.dispatchEvent(new CustomEvent("amct:api-error", { detail: error }));
  throw error;
}

export async function request(method, path, { json, form, headers: extra, signal } = {}) {
  const h = headers(extra);
  let body;
  if (json !== undefined) {
    h.set("Content-Type", "application/json");
    body = JSON.stringify(json);
  } else if (form !== undefined) {
    body = form; // the browser writes the multipart boundary itself
  }
  return check(await fetch(path, { method, headers: h, body, signal }));
}

export const getJson = async (path, opts) => (await request("GET", path, opts)).json();
export const postJson = async (path, json, opts = {}) => (await request("POST", path, { ...opts, json })).json();
export const postForm = async (path, form) => (await request("POST", path, { form })).json();

// Fetch an artifact with the key and hand it to the browser as a download: a plain <a href> could
// not send the Authorization header.
export async function download(artifact) {
  const blob = await (await request("GET", artifact.content_url)).blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = artifact.filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// Server-sent events over fetch(). EventSource cannot send an Authorization header, and the key must
// not travel in the URL (it would land in logs and history), so we read the stream ourselves and parse
// the SSE framing (spec: https://html.spec.whatwg.org/multipage/server-sent-events.html): lines of
// `field: value`, an empty line ends an event, `:` starts a comment. Reconnects with Last-Event-ID
// until the server ends the stream (it does once the job is finished) or `signal` aborts.
export async function streamEvents(path, onEvent, { signal, lastId = 0 } = {}) {
  let last = lastId;
  for (let attempt = 0; !signal?.aborted; attempt++) {
    try {
      const h = last ? { "Last-Event-ID": String(last) } : {};
      const response = await check(await fetch(path, { headers: headers(h), signal }));
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let event = { data: [] };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return; // a clean end: the job is over
        buffer += value;
        const lines = buffer.split(/\r\n|\r|\n/);
        buffer = lines.pop(); // an incomplete last line waits for the next chunk
        for (const line of lines) {
          if (line === "") {
            if (event.data.length) {
              const payload = JSON.parse(event.data.join("\n"));
              if (event.id) last = Number(event.id);
              onEvent(payload);
            }
            event = { data: [] };
            continue;
          }
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "data") event.data.push(value);
          else if (field === "id") event.id = value;
        }
        attempt = 0;
      }
    } catch (err) {
      if (signal?.aborted || err instanceof ApiError) throw err;
      await new Promise((r) => setTimeout(r, Math.min(1000 * 2 ** attempt, 15000)));
    }
  }
}
