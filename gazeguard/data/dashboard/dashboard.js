// gazeguard dashboard: the page's whole logic. Vanilla JavaScript, no build step.
//
// The server pushes Server-Sent Events on /events: "snapshot" (everything it keeps) first, then
// "aggregate" (one gazeguard.cohort/1 message), "attention" (a normalised attention message),
// "broker" (the subscription's state) and "invalid" (messages that did not validate). Every value
// is written into the DOM as text (textContent, attributes), never parsed as markup.
"use strict";

const Z95 = 1.96; // the 95 % two-sided normal quantile
const SVG = "http://www.w3.org/2000/svg";
const STALE_FACTOR = 3; // a worker is marked stale after this many bucket lengths without news

const state = {
  streams: new Map(), // "cohort\u0000worker" -> aggregates sorted by bucket
  attention: new Map(), // cohort -> attention view
  prefix: "gazeguard/v1",
  history: 60, // aggregates kept per stream (the server's --history)
};

// ------------------------------------------------------------------------------ formatting

/** A number with 4 significant digits ("3.142", "0.001235", "1.235e+21"); "—" when absent. */
function fmt(x) {
  if (x === null || x === undefined || !Number.isFinite(x)) return "—";
  return String(Number(x.toPrecision(4)));
}

/** A share (0..1) as a percentage with one decimal ("33.3"). */
function pct(x) {
  return Number.isFinite(x) ? (100 * x).toFixed(1) : "—";
}

function clock(unixS) {
  return new Date(unixS * 1000).toLocaleTimeString([], { hour12: false });
}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return node;
}

/** <span class="lo">…</span> – <span class="hi">…</span> */
function band(lo, hi, format, unit) {
  const cell = el("span", { class: "band" });
  cell.append(el("span", { class: "lo", text: format(lo) }), " – ",
    el("span", { class: "hi", text: format(hi) }));
  if (unit) cell.append(" " + unit);
  return cell;
}

// ------------------------------------------------------------------------------ the derived bands

/** The noise sd of the noisy session count: sigma, or sigma·√C when the count is the total of a
 * C-class histogram (a plan without features has no count coordinate). */
function countSd(a) {
  return a.features.length > 0 ? a.sigma : a.sigma * Math.sqrt(a.classes.length);
}

/** Each class's share with its band: (noisy count ± 1.96·sigma) / the histogram's total. */
function shareBands(a) {
  const total = a.noisy_histogram.reduce((s, h) => s + Math.max(h, 0), 0);
  return a.classes.map((name, i) => {
    const h = a.noisy_histogram[i];
    if (!(total > 0)) return { name, share: a.shares[i], lo: null, hi: null };
    return {
      name,
      share: a.shares[i],
      lo: Math.min(1, Math.max(0, (h - Z95 * a.sigma) / total)),
      hi: Math.min(1, Math.max(0, (h + Z95 * a.sigma) / total)),
    };
  });
}

// ------------------------------------------------------------------------------ rendering

function cohortSection(cohort) {
  const main = document.getElementById("cohorts");
  let section = [...main.querySelectorAll("section.cohort")].find((s) => s.dataset.cohort === cohort);
  if (section) return section;
  section = el("section", { class: "cohort", "data-cohort": cohort },
    el("h2", { text: "cohort " + cohort }),
    el("div", { class: "workers" }),
    el("div", { class: "attention" }));
  const after = [...main.querySelectorAll("section.cohort")].find((s) => s.dataset.cohort > cohort);
  main.insertBefore(section, after || null);
  document.getElementById("empty").hidden = true;
  renderAttention(cohort);
  return section;
}

function sparkline(history, index) {
  const w = 150, h = 30, pad = 2;
  const points = history.map((a) => a.features[index]).filter((f) => f !== undefined);
  const lo = Math.min(...points.map((f) => f.mean - Z95 * f.sd));
  const hi = Math.max(...points.map((f) => f.mean + Z95 * f.sd));
  const span = hi > lo ? hi - lo : 1;
  const x = (i) => (points.length > 1 ? pad + (i * (w - 2 * pad)) / (points.length - 1) : w / 2);
  const y = (v) => h - pad - ((v - lo) / span) * (h - 2 * pad);
  const root = svg("svg", { class: "spark", width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  const title = svg("title");
  title.textContent = `last ${points.length} buckets: mean (line) and 95 % band (shaded)`;
  root.append(title);
  if (points.length === 1) {
    const f = points[0];
    root.append(svg("rect", { class: "band", x: pad, width: w - 2 * pad,
      y: y(f.mean + Z95 * f.sd), height: Math.max(1, y(f.mean - Z95 * f.sd) - y(f.mean + Z95 * f.sd)) }));
    root.append(svg("polyline", { class: "mean", points: `${pad},${y(f.mean)} ${w - pad},${y(f.mean)}` }));
    return root;
  }
  const upper = points.map((f, i) => `${x(i)},${y(f.mean + Z95 * f.sd)}`);
  const lower = points.map((f, i) => `${x(i)},${y(f.mean - Z95 * f.sd)}`).reverse();
  root.append(svg("polygon", { class: "band", points: [...upper, ...lower].join(" ") }));
  root.append(svg("polyline", { class: "mean", points: points.map((f, i) => `${x(i)},${y(f.mean)}`).join(" ") }));
  return root;
}

function fact(dl, label, cls, ...content) {
  dl.append(el("dt", { text: label }), el("dd", { class: cls }, ...content));
}

function renderWorker(cohort, worker) {
  const history = state.streams.get(cohort + "\u0000" + worker);
  const a = history[history.length - 1];
  const holder = cohortSection(cohort).querySelector(".workers");
  let card = [...holder.querySelectorAll(".worker")].find((c) => c.dataset.worker === worker);
  if (!card) {
    card = el("div", { class: "worker", "data-worker": worker });
    const after = [...holder.querySelectorAll(".worker")].find((c) => c.dataset.worker > worker);
    holder.insertBefore(card, after || null);
  }
  card.replaceChildren();
  card.dataset.bucket = String(a.bucket);
  card.dataset.receivedAt = String(a.received_at);
  card.dataset.bucketS = String(a.bucket_end - a.bucket_start);
  card.append(el("h3", { text: "worker " + worker }));

  const facts = el("dl", { class: "facts" });
  fact(facts, "bucket", "bucket",
    el("span", { class: "value", text: String(a.bucket) }),
    ` (gaze ${clock(a.bucket_start)}–${clock(a.bucket_end)}, ${fmt(a.bucket_end - a.bucket_start)} s)`);
  fact(facts, "received", "received", el("span", { class: "age", text: "" }));
  const sd = countSd(a);
  fact(facts, "sessions (noisy count)", "count",
    el("span", { class: "value", text: fmt(a.noisy_count) }), ", 95 % band ",
    band(a.noisy_count - Z95 * sd, a.noisy_count + Z95 * sd, fmt),
    ` (means divided by ${a.count})`);
  fact(facts, "ε per hour (stated)", "epsilon",
    el("span", { class: "value", text: fmt(a.epsilon_per_hour) }), " at δ ",
    el("span", { class: "delta", text: String(a.delta) }),
    " — what an hour of these buckets costs each contributing person");
  fact(facts, "noise", "sigma",
    "Gaussian σ ", el("span", { class: "value", text: fmt(a.sigma) }),
    ` per coordinate (L2 sensitivity ${fmt(a.sensitivity_l2)}), `,
    el("span", { class: a.noise === "os-csprng" ? "source" : "source insecure",
      text: a.noise === "os-csprng" ? a.noise : a.noise + " (test noise: NOT private)" }));
  fact(facts, "profile", "profile", `${a.profile}` + (a.model ? `, label model ${a.model}` : ""));
  card.append(facts);

  if (a.classes.length > 0) {
    card.append(el("h4", { text: "Class shares" }));
    const table = el("table", { class: "shares" });
    table.append(el("tr", {}, el("th", { text: "class" }), el("th", { class: "num", text: "share %" }),
      el("th", { text: "95 % band, %" }), el("th", { text: "" })));
    for (const s of shareBands(a)) {
      const bar = el("div", { class: "bar" });
      const fill = el("div", { class: "fill" });
      fill.style.width = `${100 * s.share}%`;
      bar.append(fill);
      if (s.lo !== null) {
        const b = el("div", { class: "band" });
        b.style.left = `${100 * s.lo}%`;
        b.style.width = `${100 * (s.hi - s.lo)}%`;
        bar.append(b);
      }
      table.append(el("tr", { class: "class", "data-class": s.name },
        el("td", { class: "name", text: s.name }),
        el("td", { class: "share num", text: pct(s.share) }),
        el("td", {}, band(s.lo, s.hi, pct)),
        el("td", {}, bar)));
    }
    card.append(table);
  }

  if (a.features.length > 0) {
    card.append(el("h4", { text: "Feature means" }));
    const table = el("table", { class: "features" });
    table.append(el("tr", {}, el("th", { text: "feature" }), el("th", { class: "num", text: "mean" }),
      el("th", { text: "unit" }), el("th", { text: "95 % band" }), el("th", { class: "num", text: "noise sd" }),
      el("th", { text: `last ${history.length} buckets` })));
    a.features.forEach((f, i) => {
      table.append(el("tr", { class: "feature", "data-feature": f.name },
        el("td", { class: "name", text: f.name }),
        el("td", { class: "mean num", text: fmt(f.mean) }),
        el("td", { class: "unit", text: f.unit }),
        el("td", {}, band(f.mean - Z95 * f.sd, f.mean + Z95 * f.sd, fmt)),
        el("td", { class: "sd num", text: fmt(f.sd) }),
        el("td", { class: "history" }, sparkline(history, i))));
    });
    card.append(table);
  }
  updateAges();
}

// viridis, five stops
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function colour(t) {
  const x = Math.min(Math.max(t, 0), 1) * (RAMP.length - 1);
  const i = Math.min(Math.floor(x), RAMP.length - 2);
  const f = x - i;
  const c = RAMP[i].map((v, k) => Math.round(v + f * (RAMP[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function heatmap(view) {
  const grid = view.grid;
  const nr = grid.length, nc = grid[0].length;
  const values = grid.flat().filter((v) => v !== null);
  const lo = values.length ? Math.min(...values) : 0;
  const hi = values.length ? Math.max(...values) : 1;
  const cell = Math.max(6, Math.min(36, Math.floor(480 / Math.max(nr, nc))));
  const left = view.rows ? 70 : 0, top = view.cols ? 16 : 0;
  const root = svg("svg", { class: "heatmap", width: left + nc * cell, height: top + nr * cell,
    "data-rows": nr, "data-cols": nc });
  if (view.cols) view.cols.forEach((label, c) => {
    const t = svg("text", { x: left + c * cell + cell / 2, y: 11, "text-anchor": "middle" });
    t.textContent = label;
    root.append(t);
  });
  grid.forEach((row, r) => {
    if (view.rows) {
      const t = svg("text", { x: left - 4, y: top + r * cell + cell / 2 + 3, "text-anchor": "end" });
      t.textContent = view.rows[r];
      root.append(t);
    }
    row.forEach((v, c) => {
      const rect = svg("rect", { class: "cell", x: left + c * cell, y: top + r * cell,
        width: cell - 1, height: cell - 1, "data-row": r, "data-col": c,
        "data-value": v === null ? "" : v,
        fill: v === null ? "#c8ccd2" : colour(hi > lo ? (v - lo) / (hi - lo) : 0.5) });
      const title = svg("title");
      const rl = view.rows ? view.rows[r] : `row ${r}`;
      const cl = view.cols ? view.cols[c] : `col ${c}`;
      title.textContent = `${rl}, ${cl}: ${v === null ? "no value" : fmt(v)}`;
      rect.append(title);
      root.append(rect);
    });
  });
  return { root, lo, hi };
}

function renderAttention(cohort) {
  const holder = cohortSection(cohort).querySelector(".attention");
  const view = state.attention.get(cohort);
  holder.replaceChildren(el("h3", { text: "Attention" }));
  if (!view) {
    holder.append(el("p", { class: "nodata", text: "no attention data" }));
    return;
  }
  holder.append(el("p", { class: "note", text: `received ${clock(view.received_at)} on ${view.topic}` }));
  if (view.problem) holder.append(el("p", { class: "problem", text: "attention message: " + view.problem }));
  if (view.grid) {
    const { root, lo, hi } = heatmap(view);
    holder.append(root);
    holder.append(el("div", { class: "legend" }, el("span", { class: "min", text: fmt(lo) }),
      el("span", { class: "ramp" }), el("span", { class: "max", text: fmt(hi) })));
  }
  const entries = Object.entries(view.fields || {});
  if (entries.length) {
    const dl = el("dl", { class: "facts fields" });
    for (const [k, v] of entries) {
      fact(dl, k, "field", typeof v === "number" ? fmt(v) : String(v));
    }
    holder.append(dl);
  }
}

function updateAges() {
  const now = Date.now() / 1000;
  for (const card of document.querySelectorAll(".worker[data-received-at]")) {
    const age = Math.max(0, now - Number(card.dataset.receivedAt));
    const span = card.querySelector(".age");
    if (!span) continue;
    span.textContent = age < 1 ? "just now" : `${Math.round(age)} s ago`;
    span.dataset.stale = String(age > STALE_FACTOR * Math.max(Number(card.dataset.bucketS), 10));
  }
}

// ------------------------------------------------------------------------------ state

function addAggregate(a) {
  const key = a.cohort + "\u0000" + a.worker;
  let history = state.streams.get(key);
  if (!history) state.streams.set(key, (history = []));
  if (history.some((h) => h.bucket === a.bucket)) return false;
  history.push(a);
  history.sort((p, q) => p.bucket - q.bucket);
  while (history.length > state.history) history.shift();
  return history.includes(a);
}

function setBroker(b) {
  const p = document.getElementById("broker");
  p.dataset.state = b.state;
  const texts = {
    connected: `broker ${b.address}: subscribed to ${state.prefix}/cohort/+/aggregates and …/attention`,
    connecting: `broker ${b.address}: connecting…`,
    waiting: `broker ${b.address}: not reachable (${b.detail || "?"}); the dashboard keeps retrying`,
  };
  p.textContent = texts[b.state] || `broker ${b.address}: ${b.state}`;
}

function setInvalid(inv) {
  const p = document.getElementById("invalid");
  p.hidden = !inv.count;
  p.textContent = inv.count ? `${inv.count} message(s) could not be shown; the last: ${inv.last}` : "";
}

function loadSnapshot(s) {
  state.prefix = s.prefix;
  state.history = s.history;
  state.streams.clear();
  state.attention.clear();
  document.getElementById("topics").textContent = `${s.prefix}/cohort/+/aggregates`;
  for (const section of document.querySelectorAll("section.cohort")) section.remove();
  document.getElementById("empty").hidden = false;
  for (const a of s.aggregates) addAggregate(a);
  for (const v of s.attention) state.attention.set(v.cohort, v);
  for (const history of state.streams.values()) {
    const last = history[history.length - 1];
    renderWorker(last.cohort, last.worker);
  }
  for (const cohort of state.attention.keys()) renderAttention(cohort);
  setBroker(s.broker);
  setInvalid(s.invalid);
}

function connect() {
  const status = document.getElementById("connection");
  const source = new EventSource("events");
  source.addEventListener("open", () => {
    status.dataset.state = "connected";
    status.textContent = "live: aggregates appear as the broker delivers them";
  });
  source.addEventListener("error", () => {
    status.dataset.state = "lost";
    status.textContent = "connection to the dashboard server lost; reconnecting…";
  });
  source.addEventListener("snapshot", (e) => loadSnapshot(JSON.parse(e.data)));
  source.addEventListener("aggregate", (e) => {
    const a = JSON.parse(e.data);
    if (addAggregate(a)) renderWorker(a.cohort, a.worker);
  });
  source.addEventListener("attention", (e) => {
    const v = JSON.parse(e.data);
    state.attention.set(v.cohort, v);
    renderAttention(v.cohort);
  });
  source.addEventListener("broker", (e) => setBroker(JSON.parse(e.data)));
  source.addEventListener("invalid", (e) => setInvalid(JSON.parse(e.data)));
}

document.addEventListener("DOMContentLoaded", () => {
  connect();
  setInterval(updateAges, 1000);
});
