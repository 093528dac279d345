// quotaflow console: plain JavaScript over the admin API (/api/v1), with uPlot for the charts.
// Every read and change is an admin API call with the signed-in token, so the console can do
// nothing the token could not, and every change is audited like any other.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const api = "../api/v1";
let token = sessionStorage.getItem("quotaflow-token") || "";

// call sends one admin API request; it throws an Error with the API's message on failure.
async function call(method, path, body) {
  const resp = await fetch(api + path, {
    method,
    headers: { Authorization: "Bearer " + token, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  if (resp.status === 204) return null;
  const type = resp.headers.get("Content-Type") || "";
  const data = type.includes("json") ? await resp.json() : await resp.text();
  if (!resp.ok) {
    const err = new Error((data && data.message) || resp.statusText);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ""));
  return e;
}

// fill sets a table's rows; an empty table says so in a row of its own, never shows nothing.
function fill(table, rows) {
  const body = $("tbody", table);
  if (!rows.length) rows = [el("tr", { class: "none" }, el("td", { colSpan: $("thead tr", table).children.length }, "none"))];
  body.replaceChildren(...rows);
}

// NONE stands for a value that is absent: never an empty cell, nor a browser's placeholder.
const NONE = "—";
// num renders a count with thousands separators (1,000), as every number of the console is.
const num = (n) => Number(n || 0).toLocaleString("en-US");
// opt renders v with f, or NONE when v is absent.
const opt = (v, f = String) => (v === undefined || v === null || v === "" ? NONE : f(v));

// goDuration parses a Go duration ("1h30m0s", "1.5s", "500ms"), as the API writes windows,
// into milliseconds; null for anything else, such as a calendar window ("1d", "1w", "1mo").
function goDuration(s) {
  const unit = /(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|μs|ns)/g;
  const scale = { h: 3600000, m: 60000, s: 1000, ms: 1, us: 1e-3, "µs": 1e-3, "μs": 1e-3, ns: 1e-6 };
  if (!new RegExp(`^(${unit.source})+$`).test(s)) return null;
  let ms = 0;
  for (const [, n, u] of s.matchAll(unit)) ms += Number(n) * scale[u];
  return ms;
}

// dur renders a window as people write one, the same everywhere: 1s, 10s, 1m, 1h30m, 24h, and
// whole days from two on as days (7d); a calendar window (1d, 1w, 1mo, 1y) as the rules file
// names it. Not Go's 1m0s or 24h0m0s.
function dur(w) {
  if (w === undefined || w === null || w === "") return NONE;
  const ms = typeof w === "number" ? w : goDuration(String(w));
  if (ms === null) return String(w);
  const day = 86400000;
  if (ms === 0) return "0s";
  if (ms >= 2 * day && ms % day === 0) return `${ms / day}d`;
  if (ms < 1000) return `${+ms.toFixed(3)}ms`;
  let out = "", rest = ms;
  for (const [u, n] of [["h", 3600000], ["m", 60000]]) {
    if (rest >= n) {
      out += `${Math.floor(rest / n)}${u}`;
      rest %= n;
    }
  }
  if (rest) out += `${+(rest / 1000).toFixed(3)}s`;
  return out;
}

// rate renders a limit per window: "1,000 / 24h".
const rate = (limit, window) => `${num(limit)} / ${dur(window)}`;

// clip shows a long identifier or text cut to its box, whole in its title, so that no table
// overflows.
const clip = (text) => el("span", { class: "clip", title: String(text ?? "") }, opt(text));
// ruleID shows a rule's id whole, wrapped where it is too long for its box after its dots,
// underscores and dashes: ids such as edge.source_cluster_proxy.destination_cluster_payments
// differ only at their end, which a cut would hide.
const ruleID = (id) => el("span", { class: "id", title: String(id ?? "") },
  ...(id ? String(id).split(/(?<=[._-])/).flatMap((part, i) => (i ? [el("wbr"), part] : [part])) : [NONE]));
const time = (t) => new Date(t).toLocaleTimeString([], { hour12: false });
// when shows an instant's year only when it is not this one: a grant may expire years ahead.
const when = (t) => {
  const d = new Date(t);
  return d.toLocaleString([], { year: d.getFullYear() === new Date().getFullYear() ? undefined : "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hour12: false });
};

// Banners: one per missing part, the rest of the console working.
const problems = new Map();
function problem(key, message) {
  if (message) problems.set(key, message);
  else problems.delete(key);
  $("#banners").replaceChildren(...[...problems].map(([k, m]) => el("div", { class: "banner", "data-part": k }, m)));
}

async function checkHealth() {
  try {
    const h = await call("GET", "/health");
    const parts = {
      redis: ["Redis", "checks are answered by each rule's fail mode"],
      nats: ["NATS", "no live feed, and overrides and rules cannot change"],
      clickhouse: ["ClickHouse", "usage, billing and recent decisions are unavailable"],
    };
    for (const [part, [name, effect]] of Object.entries(parts)) {
      const s = h[part];
      if (s.ok) problem(part, "");
      else if (!s.configured) problem(part, `${name} is not configured on this checker: ${effect}.`);
      else problem(part, `${name} is unreachable: ${effect}. (${s.error})`);
    }
    fleet(h.processes || []);
    problem("console", "");
  } catch (e) {
    if (e.status === 401) return signOut("Your token was refused: " + e.message);
    problem("console", "The checker does not answer: " + e.message);
  }
}

// fleet lists every checker's and aggregator's own report, and raises a banner for each
// process that sees a dependency down or answers rules by fail mode.
function fleet(ps) {
  for (const k of [...problems.keys()]) if (k.startsWith("process:")) problem(k, "");
  fill($("#processes"), ps.map((p) => {
    const deps = Object.entries(p.dependencies || {}).sort();
    const down = deps.filter(([, d]) => d.state === "down");
    if (down.length) problem("process:" + p.instance, `${p.role} ${p.instance} sees ${down.map(([n, d]) => `${n} down (${d.error || "no answer"})`).join(", ")}.`);
    const fm = (p.checker && p.checker.fail_mode) || [];
    if (fm.length) problem("process:" + p.instance + ":fail", `checker ${p.instance} answers ${fm.length} rule(s) by fail mode: ${fm.map((r) => `${r.rule} (${r.fail_mode})`).join(", ")}.`);
    const a = p.aggregator;
    const r = p.checker && ((liveRates && liveRates.checkers[p.instance]) || p.checker.checks_per_second);
    return el("tr", { "data-instance": p.instance, "data-role": p.role },
      el("td", {}, p.role), el("td", {}, p.instance),
      el("td", {}, ...deps.map(([n, d]) => el("span", { class: "tag" + (d.state === "down" ? " down" : "") }, `${n} ${d.state}`))),
      r ? checksCell(r) : el("td", {}, a ? `lag ${num(a.lag_messages)} · ${num(a.partitions_owned)} partitions${a.leader ? " · leader" : ""}` : NONE));
  }));
}

// The live counters and each checker's row show one measure: the checkers' own counts of the
// checks they decided over their last health report (the live feed's rates event), the
// counters their sum. A row's checks/s is the sum of its outcomes as the counters round them.
let liveRates = null;
const perSecond = (r) => ["allowed", "delayed", "denied", "degraded"].reduce((s, k) => s + Math.round(r[k] || 0), 0);
function checksCell(r) {
  const n = perSecond(r);
  return el("td", { class: "checks", "data-checks": n }, `${num(n)} checks/s`);
}

// ---- Live: transitions and rates, as server-sent events read with fetch (EventSource cannot
// send the token).
let liveAbort;
async function live() {
  if (liveAbort) liveAbort.abort();
  const ctl = (liveAbort = new AbortController());
  liveRates = null; // until the feed's first rates, the rows show their own reports
  const q = new URLSearchParams([...new FormData($("#live-filter"))].filter(([, v]) => v));
  $("#live-status").textContent = "Connecting…";
  try {
    const resp = await fetch(`${api}/live?${q}`, { headers: { Authorization: "Bearer " + token }, signal: ctl.signal });
    if (!resp.ok) throw new Error((await resp.json()).message);
    $("#live-status").textContent = "Live: transitions appear as the aggregators publish them.";
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const chunk = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const ev = /^event: (.*)$/m.exec(chunk), data = /^data: (.*)$/m.exec(chunk);
        if (ev && data) onLive(ev[1], JSON.parse(data[1]));
      }
    }
  } catch (e) {
    if (ctl.signal.aborted) return;
    $("#live-status").textContent = "Live feed unavailable: " + e.message + " (retrying)";
  }
  if (!ctl.signal.aborted) setTimeout(live, 3000);
}

function onLive(event, d) {
  if (event === "rates") {
    liveRates = d;
    for (const k of ["allowed", "delayed", "denied", "degraded"]) $("#rate-" + k).textContent = num(Math.round(d[k]));
    for (const [instance, r] of Object.entries(d.checkers || {})) {
      const cell = $(`#processes tr[data-role="checker"][data-instance="${CSS.escape(instance)}"] td.checks`);
      if (cell) cell.replaceWith(checksCell(r));
    }
  } else if (event === "transition") {
    const li = el("li", { "data-to": d.to, "data-subject": `${d.dimension}:${d.subject}`, "data-rule": d.rule_id },
      el("span", { class: "at" }, time(d.at)),
      el("span", { class: "who" }, `${d.dimension}:${d.subject} · ${d.rule_id} · ${d.tier}`),
      el("span", { class: "state" }, `${d.from} → ${d.to}`));
    li.title = `usage ${(d.usage_ratio * 100).toFixed(0)}%, ${num(d.remaining)} of ${num(d.limit)} left`;
    const list = $("#live-list");
    list.prepend(li);
    while (list.children.length > 200) list.lastChild.remove();
  } else if (event === "error") {
    $("#live-status").textContent = d.message;
  }
}

// ---- Usage: the rollups as a chart, totals per key, and the subjects throttled most.
let chart;
async function usage() {
  const f = new FormData($("#usage-form"));
  const span = f.get("span"), by = f.get("by");
  try {
    const [s, top] = await Promise.all([call("GET", `/usage?by=${by}&span=${span}`), call("GET", `/usage/top?span=${span}`)]);
    drawChart(s);
    fill($("#usage-totals"), s.keys.map((k) => {
      const t = s.totals[k];
      return el("tr", { "data-key": k, "data-checks": t.checks }, el("td", {}, by === "rule" ? ruleID(k) : clip(k)), ...[t.checks, t.allowed, t.delayed, t.denied, t.degraded]
        .map((n) => el("td", { class: "num" }, num(n))));
    }));
    fill($("#usage-top"), top.map((r) => el("tr", { "data-subject": r.subject },
      el("td", {}, el("a", { href: `#subject/${encodeURIComponent(r.subject)}` }, clip(r.subject))), el("td", {}, opt(r.tier)),
      el("td", { class: "num" }, num(r.checks)), el("td", { class: "num" }, num(r.denied)), el("td", { class: "num" }, num(r.degraded)))));
  } catch (e) {
    problem("usage", "Usage: " + e.message);
    return;
  }
  problem("usage", "");
}

function drawChart(s) {
  const step = s.step_ns / 1e9, from = Math.floor(Date.parse(s.from) / 1000), to = Math.floor(Date.parse(s.to) / 1000);
  const xs = [];
  for (let t = from; t <= to; t += step) xs.push(t);
  const idx = new Map(xs.map((t, i) => [t, i]));
  const series = { allowed: xs.map(() => 0), denied: xs.map(() => 0), degraded: xs.map(() => 0) };
  for (const p of s.points) {
    const i = idx.get(Math.floor(Date.parse(p.at) / 1000));
    if (i === undefined) continue;
    series.allowed[i] += p.allowed; series.denied[i] += p.denied; series.degraded[i] += p.degraded;
  }
  const box = $("#usage-chart");
  const value = (u, v) => (v == null ? NONE : num(v));
  const opts = {
    width: box.clientWidth || 320, height: 240,
    series: [{}, { label: "allowed", stroke: "#1f8a4c", fill: "rgba(31,138,76,.08)", value },
      { label: "denied", stroke: "#c53030", value }, { label: "fail mode", stroke: "#6b46c1", value }],
    axes: [{}, { size: 60, values: (u, splits) => splits.map((v) => num(v)) }],
    hooks: { setLegend: [legendNone] },
  };
  if (chart) chart.destroy();
  box.replaceChildren();
  chart = new uPlot(opts, [xs, series.allowed, series.denied, series.degraded], box);
  legendNone(chart);
}

// legendNone shows uPlot's legend values without a point under the cursor as every absent
// value of the console, not as uPlot's "--".
function legendNone(u) {
  for (const v of u.root.querySelectorAll(".u-legend .u-value")) if (v.textContent === "--") v.textContent = NONE;
}

// ---- Subject: limits (a peek), overrides, billing period, recent decisions.
async function subject(s, endpoint) {
  $("#subject-body").hidden = false;
  const [dim, id] = [s.slice(0, s.indexOf(":")), s.slice(s.indexOf(":") + 1)];
  try {
    let limits, tier, quotaError;
    if (dim === "user" && !endpoint) {
      // Every rule of the user, whatever its endpoint; used, remaining and state as for any subject.
      ({ tier, limits, quota_error: quotaError } = await call("GET", `/users/${encodeURIComponent(id)}/limits`));
    } else {
      ({ tier, limits } = await call("GET", `/subjects/${encodeURIComponent(s)}/limits?endpoint=${encodeURIComponent(endpoint || "/")}`));
    }
    $("#subject-tier").textContent = `tier ${tier}`;
    // The columns a phone shows come first (rule, used, remaining, state); the minor ones last,
    // hidden on a phone.
    fill($("#subject-limits"), limits.map((l) => el("tr", { "data-rule": l.rule_id, "data-limit": l.limit, "data-state": l.state || "" },
      el("td", {}, ruleID(l.rule_id)), el("td", { class: "num" }, opt(l.used, num)), el("td", { class: "num" }, opt(l.remaining, num)),
      el("td", { class: "state " + ({ throttled: "denied-text", warning: "delayed-text", normal: "allowed-text" }[l.state] || "") }, opt(l.state)),
      el("td", { class: "num" }, rate(l.limit, l.window)), el("td", {}, opt(l.reset_at, time)),
      el("td", { class: "minor" }, opt(l.endpoint)), el("td", { class: "minor" }, opt(l.algorithm)),
      el("td", { class: "minor" }, (l.overrides || []).map((o) => o.id).join(", ") || "none"))));
    problem("subject", quotaError ? "Limits: " + quotaError : "");
  } catch (e) {
    problem("subject", "Limits: " + e.message);
  }
  const dimName = { api_key: "apikey" }[dim] || dim;
  call("GET", "/overrides").then(({ overrides: os }) => {
    const mine = os.filter((o) => o.dimension === dimName && o.identifier === id || o.tier && o.tier === $("#subject-tier").textContent.slice(5));
    $("#subject-overrides").replaceChildren(...(mine.length ? mine.map(overrideItem) : [el("li", { class: "none" }, "none")]));
  }).catch((e) => $("#subject-overrides").replaceChildren(el("li", { class: "error" }, e.message)));
  balances(dimName, id);
  billing();
  call("GET", `/subjects/${encodeURIComponent(s)}/decisions?n=50`).then((ds) => fill($("#subject-decisions"), ds.map((d) =>
    el("tr", {}, el("td", {}, time(d.at)),
      el("td", { class: d.degraded ? "degraded-text" : d.allowed ? "allowed-text" : "denied-text" },
        d.degraded ? (d.allowed ? "allowed (fail mode)" : "denied (fail mode)") : d.allowed ? (d.delay_ms ? `allowed after ${num(d.delay_ms)} ms` : "allowed") : "denied"),
      el("td", { class: "minor" }, opt(d.endpoint)), el("td", {}, d.rule ? ruleID(d.rule) : "none"), el("td", { class: "num" }, d.rule ? `${num(d.remaining)} of ${num(d.limit)}` : NONE)))))
    .catch((e) => fill($("#subject-decisions"), [el("tr", {}, el("td", { class: "error", colSpan: 5 }, e.message))]));
}

// ---- Balances: the entitlements held per the subject's dimension (the rules document names
// them; the balances live apart from it), each its balance, its grants and a form to grant more.
// balancesDrawn counts the draws asked for: an answer that comes after a later draw was asked
// is dropped, so that a slow answer never replaces the boxes a person is using.
let balancesDrawn = 0;
async function balances(dim, id) {
  const box = $("#subject-balances");
  const draw = ++balancesDrawn;
  try {
    const { entitlements = [] } = await call("GET", "/rules");
    if (draw !== balancesDrawn) return;
    const mine = entitlements.filter((e) => e.dimension === dim);
    box.replaceChildren(...(mine.length ? mine.map((e) => entitlement(e, id)) : [el("p", { class: "none" }, "none")]));
  } catch (e) {
    if (draw === balancesDrawn) box.replaceChildren(el("p", { class: "error" }, "Entitlements: " + e.message));
  }
}

// The grants' columns: left, amount and state come first, as a phone shows them; the minor ones
// are hidden there.
const grantColumns = [["id"], ["left", "num"], ["amount", "num"], ["state"], ["priority", "num minor"], ["expires", "minor"],
  ["recurs", "minor"], ["reason", "minor"], [""]];

// entitlement is one entitlement's box: its balance line, its grants and the grant form, the
// balance loaded into it.
function entitlement(e, id) {
  const table = el("table", { class: "grants" }, el("thead", {}, el("tr", {}, ...grantColumns.map(([h, c]) => el("th", c ? { class: c } : {}, h)))), el("tbody"));
  const box = el("div", { class: "entitlement", "data-entitlement": e.id },
    el("p", { class: "balance" }, el("strong", {}, e.id), ": …"), el("div", { class: "scroll" }, table), grantForm(e, id), el("p", { class: "error" }));
  call("GET", `/grants?entitlement=${encodeURIComponent(e.id)}&subject=${encodeURIComponent(id)}`)
    .then((b) => showBalance(box, e, id, b))
    .catch((x) => $(".balance", box).replaceChildren(el("strong", {}, e.id), ": ", el("span", { class: "error" }, x.message)));
  return box;
}

// day is the date of an instant as the API writes it, in the entitlement's time zone: a
// period's bounds are its midnights.
const day = (t) => String(t).slice(0, 10);

function showBalance(box, e, id, b) {
  const line = $(".balance", box);
  line.dataset.remaining = b.remaining;
  line.replaceChildren(el("strong", {}, e.id), `: ${num(b.remaining)} left · ${num(b.used)} used · ${num(b.overage)} overage · period ${day(b.period_start)} – ${day(b.period_end)} `,
    el("span", { class: "tag" }, `${e.mode || "hard"} · every ${dur(e.period)}`));
  fill($("table", box), b.grants.map((g) => grantRow(box, e, id, g)));
}

// grantState is what a grant is now: live (it counts), spent (nothing left), voided, or not in
// force (not started yet, or expired).
function grantState(g) {
  if (g.voided_at) return "voided";
  if (g.live) return "live";
  return g.remaining ? "not in force" : "spent";
}

function grantRow(box, e, id, g) {
  const state = grantState(g);
  const recurs = !g.recurring ? "once" : `every ${dur(e.period)}` + (!g.rollover ? "" :
    `, rolls over ${g.rollover.min ? num(g.rollover.min) + "–" : "up to "}${num(g.rollover.max)}`);
  return el("tr", { "data-grant": g.id, "data-state": state, "data-remaining": g.remaining },
    el("td", {}, clip(g.id)), el("td", { class: "num" }, num(g.remaining)), el("td", { class: "num" }, num(g.amount)),
    el("td", { class: "state " + ({ live: "allowed-text", voided: "denied-text", "not in force": "delayed-text" }[state] || ""),
      title: g.voided_at ? "voided " + when(g.voided_at) : "" }, state),
    el("td", { class: "num minor" }, num(g.priority)), el("td", { class: "minor" }, g.expires_at ? when(g.expires_at) : "never"),
    el("td", { class: "minor" }, recurs), el("td", { class: "wrap minor" }, opt(g.reason)),
    el("td", {}, state === "live" ? el("button", { type: "button", class: "delete", "data-void": g.id, onclick: () => voidGrant(box, e, id, g.id) }, "Void") : NONE));
}

function grantForm(e, id) {
  const form = el("form", { class: "filters grant-form" },
    el("input", { name: "amount", type: "number", min: 1, required: true, placeholder: "amount" }),
    el("label", { title: "1 is burned first" }, "priority", el("input", { name: "priority", type: "number", min: 1, defaultValue: 1, class: "short" })),
    el("input", { name: "expires", placeholder: "expires 2026-12-31 18:00", title: "optional: when it stops counting, in this browser's time; empty: never" }),
    el("label", {}, el("input", { name: "recurring", type: "checkbox" }), "recurring"),
    el("input", { name: "rollover", type: "number", min: 0, placeholder: "rollover max (optional)" }),
    el("input", { name: "reason", placeholder: "reason", required: true }),
    el("button", { type: "submit", class: "write" }, "Grant"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); makeGrant(form, e, id); });
  return form;
}

// localTime reads "2026-12-31 18:00" (a date alone: its midnight) in this browser's time zone,
// as people type a time, and answers it in RFC 3339 as the API reads one.
function localTime(s) {
  const m = /^(\d{4}-\d{2}-\d{2})(?:[ T](\d{2}:\d{2}))?$/.exec(s.trim());
  const t = m && new Date(`${m[1]}T${m[2] || "00:00"}`);
  if (!t || isNaN(t)) throw new Error(`expires: "${s}" is not a time as 2026-12-31 18:00`);
  return t.toISOString();
}

async function makeGrant(form, e, id) {
  const f = new FormData(form), error = form.nextElementSibling;
  const body = { entitlement: e.id, subject: id, amount: Number(f.get("amount")), recurring: f.get("recurring") === "on", reason: f.get("reason") };
  if (f.get("priority")) body.priority = Number(f.get("priority"));
  // Rollover is sent whenever it is filled in: the API says when a grant cannot have one.
  if (f.get("rollover")) body.rollover = { min: 0, max: Number(f.get("rollover")) };
  try {
    if (f.get("expires")) body.expires_at = localTime(f.get("expires"));
    const r = await call("POST", "/grants", body);
    error.textContent = "";
    form.reset();
    showBalance(form.parentElement, e, id, r.balance);
  } catch (x) {
    error.textContent = x.message;
  }
}

async function voidGrant(box, e, id, grant) {
  const error = box.lastElementChild;
  try {
    const r = await call("POST", `/grants/${encodeURIComponent(grant)}/void`, { entitlement: e.id, subject: id });
    error.textContent = "";
    showBalance(box, e, id, r.balance);
  } catch (x) {
    error.textContent = x.message;
  }
}

function overrideItem(o) {
  const policy = o.source && o.source !== "admin";
  return el("li", {}, el("span", { class: "tag" + (policy ? " policy" : "") }, policy ? "policy: " + o.source : "admin"), " ",
    `${o.id}: ${o.limit ? "limit " + num(o.limit) : "×" + o.multiplier}${o.rule_id ? " on " + o.rule_id : ""} until ${when(o.expires_at)}: ${o.reason}`);
}

function billingQuery() {
  const f = new FormData($("#billing-form"));
  const q = new URLSearchParams();
  if (f.get("month")) q.set("month", f.get("month"));
  if (f.get("tz")) q.set("tz", f.get("tz"));
  return q;
}

async function billing() {
  const s = $("#subject-form").subject.value;
  try {
    const b = await call("GET", `/subjects/${encodeURIComponent(s)}/billing?${billingQuery()}`);
    fill($("#subject-billing"), [...b.days, { ...b.total, day: "total " + b.month }].map((d) => el("tr", { "data-day": d.day },
      el("td", {}, d.day), ...[d.checks, d.allowed, d.allowed_cost, d.denied, d.degraded].map((n) => el("td", { class: "num" }, num(n))))));
  } catch (e) {
    fill($("#subject-billing"), [el("tr", {}, el("td", { class: "error", colSpan: 6 }, e.message))]);
  }
}

async function billingCSV() {
  const s = $("#subject-form").subject.value, q = billingQuery();
  q.set("format", "csv");
  try {
    const text = await call("GET", `/subjects/${encodeURIComponent(s)}/billing?${q}`);
    const a = el("a", { href: URL.createObjectURL(new Blob([text], { type: "text/csv" })), download: `${s.replace(/[^\w.-]/g, "_")}-${q.get("month") || "month"}.csv` });
    a.click();
    URL.revokeObjectURL(a.href);
  } catch (e) {
    problem("billing", "Billing CSV: " + e.message);
  }
}

// ---- Overrides and rules.
async function overrides() {
  try {
    const { overrides: os } = await call("GET", "/overrides");
    fill($("#overrides"), os.map((o) => el("tr", { "data-id": o.id },
      el("td", {}, clip(o.id)), el("td", {}, clip(o.identifier ? `${o.dimension}:${o.identifier}` : o.tier ? "tier " + o.tier : "rule")),
      el("td", {}, o.rule_id ? ruleID(o.rule_id) : "all"), el("td", { class: "num" }, o.limit ? num(o.limit) : "×" + o.multiplier), el("td", {}, when(o.expires_at)),
      el("td", {}, el("span", { class: "tag" + (o.source !== "admin" ? " policy" : "") }, o.source === "admin" ? o.creator : "policy: " + o.source)),
      el("td", { class: "wrap" }, o.reason),
      el("td", {}, el("button", { type: "button", class: "delete", onclick: () => deleteOverride(o.id) }, "Delete")))));
    problem("overrides", "");
  } catch (e) {
    problem("overrides", "Overrides: " + e.message);
  }
}

async function createOverride(ev) {
  ev.preventDefault();
  const f = new FormData(ev.target), body = {};
  for (const k of ["dimension", "identifier", "tier", "rule_id", "duration", "reason"]) if (f.get(k)) body[k] = f.get(k);
  if (!body.identifier) delete body.dimension;
  if (f.get("limit")) body.limit = Number(f.get("limit"));
  if (f.get("multiplier")) body.multiplier = Number(f.get("multiplier"));
  try {
    await call("POST", "/overrides", body);
    $("#override-error").textContent = "";
    ev.target.reset();
    overrides();
  } catch (e) {
    $("#override-error").textContent = e.message;
  }
}

async function deleteOverride(id) {
  try {
    await call("DELETE", `/overrides/${encodeURIComponent(id)}`);
  } catch (e) {
    $("#override-error").textContent = e.message;
  }
  overrides();
}

async function rulesView() {
  try {
    const doc = await call("GET", "/rules");
    // A rules document writes a limit as a number or a string, and a window as its author did
    // (60s, 1m, 24h, 1mo): both are rendered as everywhere else.
    fill($("#rules"), (doc.rules || []).map((r) => el("tr", { "data-rule": r.id },
      el("td", {}, ruleID(r.id)), el("td", {}, opt(r.dimension)), el("td", {}, clip(r.endpoint)), el("td", {}, r.tier || "all"),
      el("td", {}, r.algorithm || "unlimited"), el("td", { class: "num" }, opt(r.limit, (n) => (isNaN(Number(n)) ? n : num(n)))),
      el("td", {}, opt(r.window, dur)),
      el("td", {}, r.candidate_of ? el("span", {}, "candidate of ", ruleID(r.candidate_of)) : r.shadow ? "shadow" : "enforced"))));
    const list = (items) => (items.length ? items : [el("li", { class: "none" }, "none")]);
    $("#tiers").replaceChildren(...list(Object.entries(doc.tiers || {}).map(([name, t]) =>
      el("li", {}, el("strong", {}, name), name === doc.default_tier ? " (default) " : " ", t.description || ""))));
    // The rule store keeps users apart from the document, and GET /rules answers without them:
    // absent is not none.
    $("#users").replaceChildren(...(doc.users ? list(Object.entries(doc.users).map(([name, u]) =>
      el("li", {}, el("a", { href: `#subject/${encodeURIComponent("user:" + name)}` }, name), " ", u.tier ? "tier " + u.tier : ""))) :
      [el("li", { class: "none" }, `${NONE} not listed by the rules API: look a user up in the `, el("a", { href: "#subject" }, "Subject"), " view")]));
    problem("rules", "");
  } catch (e) {
    problem("rules", "Rules: " + e.message);
  }
}

// ---- Webhooks: the endpoints entitlement events are delivered to, and a chosen one's latest
// deliveries (#webhooks/<id>). Endpoints are set with the CLI or the API, not here.
async function webhooksView(chosen) {
  try {
    const { webhooks: ws } = await call("GET", "/webhooks");
    fill($("#webhooks"), ws.map((w) => el("tr", { "data-id": w.id, "data-disabled": w.disabled ? "true" : "false", class: w.id === chosen ? "chosen" : "" },
      el("td", {}, clip(w.id)), el("td", {}, clip(w.url)), el("td", { class: "wrap" }, (w.filter || []).join(", ") || "all events"),
      el("td", { class: w.disabled ? "denied-text" : "allowed-text" }, w.disabled ? "disabled" : "enabled"),
      el("td", { class: "minor" }, w.secret_hint),
      el("td", {}, el("a", { href: `#webhooks/${encodeURIComponent(w.id)}` }, "deliveries")))));
  } catch (e) {
    fill($("#webhooks"), [el("tr", {}, el("td", { class: "error", colSpan: 6 }, e.message))]);
  }
  $("#deliveries-box").hidden = !chosen;
  if (chosen) deliveries(chosen);
}

async function deliveries(id) {
  $("#deliveries-of").textContent = "of " + id;
  try {
    const { deliveries: ds } = await call("GET", `/webhooks/${encodeURIComponent(id)}/deliveries?n=50`);
    fill($("#deliveries"), (ds || []).map((d) => el("tr", { "data-message": d.message_id, "data-outcome": d.outcome },
      el("td", {}, when(d.at)), el("td", { class: { delivered: "allowed-text", retry: "delayed-text" }[d.outcome] || "denied-text" }, d.outcome),
      el("td", { class: "num" }, d.status ? String(d.status) : NONE), el("td", { class: "num minor" }, num(d.attempt)),
      el("td", { class: "num minor" }, dur(d.duration_ms)), el("td", { class: "minor" }, d.next_ms ? "in " + dur(d.next_ms) : NONE),
      el("td", { class: "minor" }, clip(d.message_id)), el("td", { class: "wrap" }, opt(d.error)))));
  } catch (e) {
    fill($("#deliveries"), [el("tr", {}, el("td", { class: "error", colSpan: 8 }, e.message))]);
  }
}

// ---- Navigation: one view at a time, from the location's hash (#usage, #subject/user:alice,
// #webhooks/billing).
const views = { live: () => {}, usage, subject: () => {}, overrides, rules: rulesView, webhooks: webhooksView };
function route() {
  const [name, arg] = (location.hash.slice(1) || "live").split("/");
  const view = views[name] ? name : "live";
  for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== "view-" + view;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === "#" + view);
  if (view === "subject" && arg) {
    $("#subject-form").subject.value = decodeURIComponent(arg);
    subject(decodeURIComponent(arg), $("#subject-form").endpoint.value);
  } else views[view](arg && decodeURIComponent(arg));
}

function signOut(message) {
  token = "";
  sessionStorage.removeItem("quotaflow-token");
  if (liveAbort) liveAbort.abort();
  $("#app").hidden = true;
  $("#signout").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
}

async function signIn() {
  try {
    await call("GET", "/health");
  } catch (e) {
    return signOut(e.status === 401 ? "That token was refused." : e.message);
  }
  sessionStorage.setItem("quotaflow-token", token);
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#signout").hidden = false;
  checkHealth();
  live();
  route();
}

let healthTimer, usageTimer;
function start() {
  $("#login").addEventListener("submit", (ev) => { ev.preventDefault(); token = $("#token").value.trim(); signIn(); });
  $("#signout").addEventListener("click", () => signOut());
  $("#live-filter").addEventListener("submit", (ev) => { ev.preventDefault(); $("#live-list").replaceChildren(); live(); });
  $("#usage-form").addEventListener("submit", (ev) => { ev.preventDefault(); usage(); });
  $("#subject-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const hash = "#subject/" + encodeURIComponent(ev.target.subject.value.trim());
    // A new hash routes through hashchange; the same one (a look again) routes here.
    if (location.hash === hash) route();
    else location.hash = hash;
  });
  $("#billing-form").addEventListener("submit", (ev) => { ev.preventDefault(); billing(); });
  $("#billing-csv").addEventListener("click", billingCSV);
  $("#override-form").addEventListener("submit", createOverride);
  window.addEventListener("hashchange", route);
  healthTimer = setInterval(() => token && checkHealth(), 5000);
  usageTimer = setInterval(() => token && !$("#view-usage").hidden && usage(), 10000);
  if (token) signIn();
  else signOut();
}
start();
