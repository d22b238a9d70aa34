// The mlx-kit status page: polls /ui/data once a second (never two at once), draws two
// small SVG charts of its own (no chart library), and streams a chat from
// /v1/chat/completions. Every value from the server goes in as text (textContent), never
// as markup. The API key, when the server has one, stays in this tab (sessionStorage).
"use strict";

const KEY = "mlx-kit-api-key";
const POLL_MS = 1000;
const WINDOW_S = 10 * 60;  // the charts' time span
const $ = (id) => document.getElementById(id);

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = sessionStorage.getItem(KEY);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// binary units, as the CLI prints sizes (kit.models.memory.human)
function bytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(2)) + " " + units[i];
}

function text(id, value) { $(id).textContent = String(value); }

function row(tbody, cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    td.textContent = c === null || c === undefined ? "" : String(c);
    tr.appendChild(td);
  }
  tbody.appendChild(tr);
}

function showError(message) {
  const el = $("error");
  el.hidden = !message;
  el.textContent = message || "";
}

// ---- data --------------------------------------------------------------------------------

async function poll() {
  try {
    const r = await fetch("/ui/data", {headers: headers(), cache: "no-store"});
    if (r.status === 401) {
      $("keyform").hidden = false;
      showError("");
      setState("key needed", "down");
      return;
    }
    const body = await r.json();
    if (!r.ok) {
      showError((body.error && body.error.message) || ("HTTP " + r.status));
      setState("error", "down");
      return;
    }
    $("keyform").hidden = true;
    showError("");
    render(body);
  } catch (e) {
    setState("unreachable", "down");
    showError("the server does not answer (" + e.message + ")");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function setState(label, cls) {
  const el = $("state");
  el.textContent = label;
  el.className = "pill " + cls;
}

function render(d) {
  const h = d.health;
  setState(h.model_state, h.model_state === "ready" ? "ok" : h.model_state);
  text("model", h.model);
  text("version", "v" + h.version);
  text("updated", "updated " + new Date(d.now * 1000).toLocaleTimeString());
  renderMemory(h, d.system);
  text("served", h.requests_served);
  text("prompt-tokens", d.totals.prompt_tokens);
  text("generated-tokens", d.totals.generated_tokens);
  text("cache-rate", cacheRate(h.prompt_cache, d.totals));
  text("swaps", h.swaps + " / " + h.restarts);
  renderLive(d.live, d.live_total);
  renderModels(d.models);
  const now = d.now;
  const recent = d.samples.filter((s) => now - s.t <= WINDOW_S);
  chart($("chart-ttft"), recent.map((s) => [s.t, s.ttft_s]), now);
  chart($("chart-tps"), recent.map((s) => [s.t, s.tokens_per_s]), now);
}

function cacheRate(pc, totals) {
  // the engine's prompt cache counters when it reports them, else the share of prompt
  // tokens served from the cache since the server started
  if (pc && typeof pc.misses === "number") {
    const hits = (pc.memory_hits || 0) + (pc.disk_hits || 0);
    const all = hits + pc.misses;
    if (!all) return "–";
    let s = (100 * hits / all).toFixed(0) + "% of requests";
    if (typeof pc.disk_hits === "number") s += " (" + (pc.memory_hits || 0) + " memory, " + pc.disk_hits + " disk)";
    return s;
  }
  if (!totals.prompt_tokens) return "–";
  return (100 * totals.cached_prompt_tokens / totals.prompt_tokens).toFixed(0) + "% of prompt tokens";
}

function renderMemory(h, system) {
  const m = h.memory || {};
  const admission = h.admission || {};  // the engine's memory ceiling, when it reports one
  const budget = admission.ceiling_bytes || null;
  const total = budget || system.total_bytes;
  const weights = m.weights_bytes || 0;
  const active = Math.max((m.active_bytes || 0) - weights, 0);
  $("mem-weights").style.width = Math.min(100, 100 * weights / total) + "%";
  $("mem-active").style.width = Math.min(100, 100 * active / total) + "%";
  text("mem-text", "weights " + bytes(m.weights_bytes) + ", active " + bytes(m.active_bytes) +
       ", peak " + bytes(m.peak_bytes) + " of " + bytes(total) +
       (budget ? " (ceiling: " + (admission.ceiling_source || "budget") + ")"
               : " (this machine; " + bytes(system.available_bytes) + " available)"));
}

function renderLive(live, total) {
  const tbody = $("live").tBodies[0];
  tbody.replaceChildren();
  for (const r of live) {
    row(tbody, [r.id, r.protocol, r.agent, r.model, r.state, r.age_s.toFixed(1) + " s",
                r.prompt_tokens + (r.cached_tokens ? " (" + r.cached_tokens + " cached)" : ""),
                r.outputs]);
  }
  $("live-empty").hidden = live.length > 0;
  text("live-count", total > live.length ? "(" + total + ", first " + live.length + " shown)" : "(" + total + ")");
}

function renderModels(models) {
  const tbody = $("models").tBodies[0];
  tbody.replaceChildren();
  for (const m of models) {
    row(tbody, [m.id, m.id === m.model ? "" : m.model, m.loaded ? "yes" : "",
                m.quantization || "", m.size_bytes ? bytes(m.size_bytes) : "",
                m.context_window || ""]);
  }
}

// ---- charts: points [unix seconds, value|null] over the last WINDOW_S -----------------

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG, tag);
  for (const k in attrs) el.setAttribute(k, attrs[k]);
  parent.appendChild(el);
  return el;
}

function chart(el, points, now) {
  el.replaceChildren();
  const W = 400, H = 140, L = 36, B = 16, T = 6;
  const pts = points.filter((p) => typeof p[1] === "number" && isFinite(p[1]));
  const max = Math.max(1e-9, ...pts.map((p) => p[1])) * 1.1;
  svg("line", {x1: L, y1: H - B, x2: W, y2: H - B, class: "axis"}, el);
  svg("line", {x1: L, y1: T, x2: L, y2: H - B, class: "axis"}, el);
  svg("text", {x: 2, y: T + 8, class: "label"}, el).textContent = pts.length ? max.toPrecision(2) : "";
  svg("text", {x: 2, y: H - B, class: "label"}, el).textContent = "0";
  svg("text", {x: L, y: H - 2, class: "label"}, el).textContent = "-" + (WINDOW_S / 60) + " min";
  svg("text", {x: W - 24, y: H - 2, class: "label"}, el).textContent = "now";
  if (!pts.length) {
    svg("text", {x: L + 10, y: H / 2, class: "label"}, el).textContent = "no requests yet";
    return;
  }
  const x = (t) => L + (W - L) * (1 - (now - t) / WINDOW_S);
  const y = (v) => H - B - (H - B - T) * v / max;
  const d = pts.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1)).join(" ");
  svg("path", {d: d, class: "line"}, el);
  for (const p of pts) svg("circle", {cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 2.5, class: "dot"}, el);
}

// ---- chat: a streamed /v1/chat/completions on `local` ------------------------------------

const history = [];

function message(role, content) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = content;
  $("chat-log").appendChild(div);
  return div;
}

async function chat(ev) {
  ev.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt) return;
  $("prompt").value = "";
  $("send").disabled = true;
  message("user", prompt);
  history.push({role: "user", content: prompt});
  const out = message("assistant", "");
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers({"Content-Type": "application/json"}),
      body: JSON.stringify({model: "local", messages: history.slice(-20), stream: true, max_tokens: 256})});
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      out.textContent = "error: " + ((body.error && body.error.message) || ("HTTP " + r.status));
      history.pop();
      return;
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "", answer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      // sse-starlette ends lines with \r\n; the SSE spec allows \r, \n or both
      buffer = (buffer + decoder.decode(value, {stream: true})).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) { answer += "\nerror: " + chunk.error.message; continue; }
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) answer += delta.content;
        }
        out.textContent = answer;
      }
    }
    history.push({role: "assistant", content: answer});
    out.dataset.done = "1";
  } catch (e) {
    out.textContent = "error: " + e.message;
  } finally {
    $("send").disabled = false;
  }
}

function useKey(ev) {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("key").value = "";
}

document.addEventListener("DOMContentLoaded", () => {
  $("chat").addEventListener("submit", chat);
  $("keyform").addEventListener("submit", useKey);
  poll();
});
