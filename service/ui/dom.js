// Small DOM and formatting helpers shared by the views. Text always goes in as text nodes, never as
// HTML: job names, errors and file names come from users.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function statusChip(status) {
  return h("span", { class: `status status-${status}`, "data-status": status }, status);
}

// A bar whose fill width and aria-valuenow both follow the job's progress (0..1).
export function progressBar(progress = 0) {
  const fill = h("span", { class: "fill" });
  const bar = h("span", { class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100 }, fill);
  const label = h("span", { class: "pct" });
  const wrap = h("span", { class: "progress" }, bar, label);
  wrap.update = (value, status) => {
    const pct = Math.max(0, Math.min(100, Math.round((value || 0) * 1000) / 10));
    fill.style.width = `${pct}%`;
    bar.setAttribute("aria-valuenow", String(pct));
    bar.dataset.state = status || "";
    label.textContent = `${pct.toFixed(pct < 100 ? 1 : 0)}%`;
  };
  wrap.update(progress);
  return wrap;
}

export function bytes(n) {
  if (n === undefined || n === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function duration(seconds) {
  if (seconds === undefined || seconds === null || Number.isNaN(seconds)) return "–";
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const m = Math.floor(seconds / 60);
  if (m < 60) return `${m} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function elapsed(job, now = Date.now()) {
  if (!job.started_at) return null;
  const end = job.finished_at ? Date.parse(job.finished_at) : now;
  return (end - Date.parse(job.started_at)) / 1000;
}

export function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

export function number(x, digits = 3) {
  if (x === undefined || x === null) return "–";
  if (Number.isInteger(x)) return x.toLocaleString("en-US");
  return x.toFixed(digits);
}
