// The ws-tune dashboard: polls the service's JSON API (/api/v1) and draws it. No
// libraries, no network beyond this server: it works on an air-gapped cluster.
"use strict";

const API = "/api/v1";
const JOBS_EVERY_MS = 1000, WORKLOADS_EVERY_MS = 5000, WORKLOAD_EVERY_MS = 2000;
let selected = null;  // the workload shown

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

const fmt = (x, digits = 1) => (x === null || x === undefined ? "-" : Number(x).toFixed(digits));
// GB/s only where the kernel file says what a call moves: its column shows where any row has a figure.
const gbpsCells = (table, rows, value) => {
  const shown = rows.some((r) => value(r) !== null && value(r) !== undefined);
  $(`${table} th.gbps`).hidden = !shown;
  return (r) => (shown ? [el("td", { class: "num gbps" }, fmt(value(r)))] : []);
};
const problemText = (p) => Object.entries(p).map(([k, v]) => `${k}=${v}`).join(",");

async function api(path) {
  const token = localStorage.getItem("ws-tune-token");
  const response = await fetch(API + path, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
  if (response.status === 401) {
    $("#token-form").hidden = false;
    throw new Error("this server needs an API token to read");
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.detail || `${response.status} ${response.statusText}`);
  }
  return response.json();
}

function status(message) {
  $("#status").textContent = message;
}

// --- jobs ---------------------------------------------------------------------------
async function refreshJobs() {
  const jobs = await api("/jobs?limit=20");
  const body = $("#jobs-table tbody");
  body.replaceChildren(...jobs.data.map(jobRow));
  $("#jobs-empty").hidden = jobs.count > 0;
}

function jobRow(job) {
  const p = job.progress;
  const finished = p.done + p.failed;
  const bar = el("progress", { max: 1, value: p.fraction });  // the API's own measure of the search's progress
  const link = job.workload_id
    ? el("a", { href: `#workload=${job.workload_id}` }, `#${job.workload_id}`)
    : "-";
  return el("tr", { "data-job-id": job.id },
    el("td", {}, job.id), el("td", {}, job.kernel), el("td", {}, problemText(job.problem)),
    el("td", { class: `state state-${job.state}` }, job.state),
    el("td", {}, bar, " ", el("span", { class: "done" }, finished), ` / ${p.budget}`,
       p.running ? ` (${p.running} running)` : "", p.failed ? `, ${p.failed} failed` : ""),
    el("td", { class: "num" }, job.best ? fmt(job.best.median_ms, 4) : "-"),
    el("td", {}, link));
}

// --- workloads ------------------------------------------------------------------------
async function refreshWorkloads() {
  const workloads = await api("/workloads?limit=100");
  const body = $("#workloads-table tbody");
  const gbps = gbpsCells("#workloads-table", workloads.data, (w) => w.best_gbps);
  body.replaceChildren(...workloads.data.map((w) => {
    const row = el("tr", { class: "selectable" + (w.id === selected ? " selected" : ""), "data-workload-id": w.id },
      el("td", {}, w.id), el("td", {}, w.kernel), el("td", {}, problemText(w.problem)), el("td", {}, w.device),
      el("td", { class: "num" }, w.trials), el("td", { class: "num" }, fmt(w.best_tflops)), ...gbps(w));
    row.addEventListener("click", () => { location.hash = `workload=${w.id}`; });
    return row;
  }));
  $("#workloads-empty").hidden = workloads.count > 0;
  if (selected === null && workloads.data.length) {
    selected = workloads.data[0].id;
    await refreshWorkload();
  }
}

async function refreshWorkload() {
  if (selected === null) return;
  const w = await api(`/workloads/${selected}`);
  $("#workload").hidden = false;
  $("#workload-title").textContent = `${w.workload.kernel} ${problemText(w.workload.problem)} on ${w.workload.device}`;
  const counts = Object.entries(w.counts).map(([k, v]) => `${v} ${k}`).join(", ");
  $("#workload-meta").textContent = `workload ${w.workload.id}; ${w.workload.arch}, tilelang ${w.workload.tilelang_version}, ` +
    `CUDA ${w.workload.cuda_version}; trials: ${counts || "none"}`;
  document.querySelectorAll("#workloads-table tr[data-workload-id]").forEach((tr) => {
    tr.classList.toggle("selected", Number(tr.dataset.workloadId) === selected);
  });
  const gbps = gbpsCells("#leaderboard", w.leaderboard, (r) => r.gbps);
  $("#leaderboard tbody").replaceChildren(...w.leaderboard.map((r) => el("tr", { "data-row": r.name },
    el("td", {}, r.name), el("td", { class: "num" }, fmt(r.tflops)), ...gbps(r), el("td", { class: "num" }, fmt(r.median_ms, 4)),
    el("td", { class: "num" }, fmt(r.ratio, 3)), el("td", {}, r.candidate_hash ? (r.confirmed ? "yes" : "no") : "-"),
    el("td", { title: r.label || "" }, r.candidate_hash || "-"))));
  plot(w.trials);
  diff(w);
}

// --- the plot: TFLOP/s of each trial (dots) and the best so far (a step line) ----------
function plot(trials) {
  const area = $("#plot");
  const timed = trials.filter((t) => t.tflops !== null);
  area.replaceChildren();
  $("#plot-note").hidden = timed.length > 0;
  $("#plot-note").textContent = trials.length
    ? `${trials.length} trial(s), none timed (compile-only, or still building).`
    : "No search trials yet.";
  if (!timed.length) return;
  const W = 720, H = 280, L = 56, R = 12, T = 12, B = 34;
  const n = trials.length;
  const top = Math.max(...timed.map((t) => t.tflops)) * 1.08, bottom = 0;
  const x = (i) => L + (n === 1 ? 0.5 : (i - 1) / (n - 1)) * (W - L - R);
  const y = (v) => T + (1 - (v - bottom) / (top - bottom)) * (H - T - B);
  area.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
              svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const v of [0, top / 2, top / 1.08]) {
    area.append(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v, 0)));
  }
  area.append(svg("text", { x: L, y: H - 8 }, "1"), svg("text", { x: W - R, y: H - 8, "text-anchor": "end" }, `${n} trials`));
  let path = "";
  for (const t of trials) {
    if (t.best_tflops === null) continue;
    path += `${path ? "L" : "M"}${x(t.n).toFixed(1)},${y(t.best_tflops).toFixed(1)} `;
  }
  area.append(svg("path", { class: "best", d: path }));
  for (const t of timed) {
    const dot = svg("circle", { class: "trial", cx: x(t.n).toFixed(1), cy: y(t.tflops).toFixed(1), r: 3.5, "data-n": t.n });
    const gbps = t.gbps === null ? "" : `, ${fmt(t.gbps)} GB/s`;
    dot.append(svg("title", {}, `trial ${t.n} (${t.role}): ${fmt(t.tflops)} TFLOP/s${gbps}, ratio ${fmt(t.ratio, 3)}, ${t.candidate_hash}`));
    area.append(dot);
  }
}

function diff(w) {
  const note = $("#diff-note");
  note.hidden = w.diff.length > 0;
  note.textContent = !w.seed_source ? "No seed schedule stored for this workload."
    : !w.best_source ? "No timed winner yet: the seed's schedule:" : "";
  const rows = w.diff.length ? w.diff
    : (w.seed_source || "").split("\n").filter((s) => s).map((s) => ({ op: "same", seed: s, best: "" }));
  $("#diff tbody").replaceChildren(...rows.map((d) => el("tr", { class: d.op },
    el("td", {}, d.seed ?? ""), el("td", {}, d.best ?? ""))));
}

// --- polling --------------------------------------------------------------------------
function every(ms, fn) {
  const run = async () => {
    try {
      await fn();
      status(`updated ${new Date().toLocaleTimeString()}`);
    } catch (err) {
      status(String(err.message || err));
    }
    setTimeout(run, ms);
  };
  run();
}

function fromHash() {
  const m = /workload=(\d+)/.exec(location.hash);
  if (m) {
    selected = Number(m[1]);
    refreshWorkload().catch((err) => status(String(err.message || err)));
  }
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  localStorage.setItem("ws-tune-token", $("#token").value.trim());
  $("#token-form").hidden = true;
});
window.addEventListener("hashchange", fromHash);
fromHash();
every(JOBS_EVERY_MS, refreshJobs);
every(WORKLOADS_EVERY_MS, refreshWorkloads);
every(WORKLOAD_EVERY_MS, refreshWorkload);
