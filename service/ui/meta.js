// What the server says it runs (GET /v1/meta: job kinds, deploy formats, devices, objectives, job states),
// read from its tables, so the dashboard keeps no copy. Fetched once, and again after a failure (no key yet).

import { getJson } from "./api.js";

let request = null;

export function serverMeta() {
  if (!request) request = getJson("/v1/meta").catch((err) => { request = null; throw err; });
  return request;
}

// The states a job ends in (meta.terminal_states), filled by loadMeta() before a view is mounted.
export const TERMINAL = new Set();

export async function loadMeta() {
  if (TERMINAL.size) return;
  try {
    // Its own request, not serverMeta()'s: one still pending from before the key was set would fail too.
    const meta = await getJson("/v1/meta");
    for (const status of meta.terminal_states) TERMINAL.add(status);
  } catch {
    // 401 without a key: shown by the banner; the views mount again once a key is pasted
  }
}
