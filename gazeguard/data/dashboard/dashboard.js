// gazeguard dashboard: the page's whole logic. Vanilla JavaScript, no build step.
//
// The server pushes Server-Sent Events on /events: "snapshot" (everything it keeps) first, then
// "aggregate" (one gazeguard.cohort/1 message), "attention" (one gazeguard.attention/1 message),
// "mode" (one gazeguard.mode/1 message: the group's dominant activity in a bucket),
// "broker" (the subscription's state) and "invalid" (messages that did not validate). Each message
// comes with "readability" (computed by the server from the message's own fields: whether each
// figure's 95 % band is narrow enough to read, and the sessions it would need). Every value is
// written into the DOM as text (textContent, attributes), never parsed as markup.
"use strict";

const Z95 = 1.96; // the 95 % two-sided normal quantile
const READABLE = 0.1; // a figure is readable when its band's half-width is within 10 % of its scale
const SVG = "http://www.w3.org/2000/svg";
const STALE_FACTOR = 3; // a worker is marked stale after this many bucket lengths without news
const NO_ATTENTION_AFTER = 2; // aggregates of this many buckets without attention: none released

const state = {
  streams: new Map(), // "cohort\u0000worker" -> aggregates sorted by bucket
  attention: new Map(), // "cohort\u0000worker" -> the latest attention message
  modes: new Map(), // "cohort\u0000worker" -> mode messages sorted by bucket
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

/** A whole number with thousands separators ("3,630"). */
function whole(n) {
  return Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "—";
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

/** A figure's readability marker: <span class="readability" data-readable="yes|no">. `r` is the
 * server's figure (readable, half_width and limit as shares of the scale, sessions, scale). */
function readMark(r) {
  if (!r) return null;
  const half = r.half_width === null ? "unbounded" : `±${pct(r.half_width)} %`;
  const mark = el("span", { class: "readability", "data-readable": r.readable ? "yes" : "no",
    "data-sessions": String(r.sessions),
    text: r.readable ? "readable" : `too noisy: needs ≥ ${whole(r.sessions)} sessions` });
  mark.title = `95 % band ${half} of ${r.scale}; readable within ±${pct(r.limit)} %, ` +
    `from ${whole(r.sessions)} sessions per bucket at this noise`;
  return mark;
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
    el("div", { class: "workers" }));
  const after = [...main.querySelectorAll("section.cohort")].find((s) => s.dataset.cohort > cohort);
  main.insertBefore(section, after || null);
  document.getElementById("empty").hidden = true;
  return section;
}

function workerCard(cohort, worker) {
  const holder = cohortSection(cohort).querySelector(".workers");
  let card = [...holder.querySelectorAll(".worker")].find((c) => c.dataset.worker === worker);
  if (!card) {
    card = el("div", { class: "worker", "data-worker": worker },
      el("h3", { text: "worker " + worker }),
      el("div", { class: "aggregate" }),
      el("div", { class: "mode" }),
      el("div", { class: "attention" }));
    const after = [...holder.querySelectorAll(".worker")].find((c) => c.dataset.worker > worker);
    holder.insertBefore(card, after || null);
  }
  return card;
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

/** One paragraph on what this bucket can be read for: the figures too noisy to read and the
 * sessions each needs, with the levers that lower that number. */
function verdict(a) {
  const r = a.readability || {};
  const parts = [["the session count", r.count], ["the feature means", r.means], ["the class shares", r.shares]]
    .filter(([, x]) => x);
  const noisy = parts.filter(([, x]) => !x.readable);
  const p = el("p", { class: "verdict", "data-readable": noisy.length ? "no" : "yes" });
  if (!noisy.length) {
    p.textContent = `Every figure of this bucket is readable: its 95 % band is within ±${pct(READABLE)} % of its scale.`;
    return p;
  }
  const about = Math.max(0, Math.round(a.noisy_count));
  const needs = noisy.map(([name, x]) => `${name} from ${whole(x.sessions)}`).join(", ");
  p.textContent = `${noisy.length === parts.length ? "Too few sessions to read any figure" : "Some figures are too noisy to read"}: ` +
    `this bucket had about ${whole(about)} session${about === 1 ? "" : "s"}. At this noise a figure's 95 % band ` +
    `is narrow enough (±${pct(READABLE)} % of its scale) with ${needs} sessions per bucket. ` +
    "Greyed values are shown, but their band says more than the value. Longer buckets (cohort.bucket_s) " +
    "or fewer features lower the sessions needed.";
  return p;
}

function renderWorker(cohort, worker) {
  const history = state.streams.get(cohort + "\u0000" + worker);
  const card = workerCard(cohort, worker);
  if (!history || !history.length) return;
  const a = history[history.length - 1];
  const holder = card.querySelector(".aggregate");
  holder.replaceChildren();
  const r = a.readability || {};
  card.dataset.bucket = String(a.bucket);
  card.dataset.receivedAt = String(a.received_at);
  card.dataset.bucketS = String(a.bucket_end - a.bucket_start);

  holder.append(verdict(a));
  const facts = el("dl", { class: "facts" });
  fact(facts, "bucket", "bucket",
    el("span", { class: "value", text: String(a.bucket) }),
    ` (gaze ${clock(a.bucket_start)}–${clock(a.bucket_end)}, ${fmt(a.bucket_end - a.bucket_start)} s)`);
  fact(facts, "received", "received", el("span", { class: "age", text: "" }));
  const sd = countSd(a);
  const count = el("dd", { class: "count" + (r.count && !r.count.readable ? " unreadable" : "") },
    "about ", el("span", { class: "about", text: whole(Math.max(0, a.noisy_count)) }),
    " (noisy count ", el("span", { class: "value", text: fmt(a.noisy_count) }), "), 95 % band ",
    band(a.noisy_count - Z95 * sd, a.noisy_count + Z95 * sd, fmt),
    ` (means divided by ${a.count}) `, readMark(r.count));
  facts.append(el("dt", { text: "sessions" }), count);
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
  holder.append(facts);

  if (a.classes.length > 0) {
    holder.append(el("h4", { text: "Class shares" }));
    const table = el("table", { class: "shares" });
    table.append(el("tr", {}, el("th", { text: "class" }), el("th", { class: "num", text: "share %" }),
      el("th", { text: "95 % band, %" }), el("th", { text: "" }), el("th", { text: "readable?" })));
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
      table.append(el("tr", { class: "class" + (r.shares && !r.shares.readable ? " unreadable" : ""), "data-class": s.name },
        el("td", { class: "name", text: s.name }),
        el("td", { class: "share num", text: pct(s.share) }),
        el("td", {}, band(s.lo, s.hi, pct)),
        el("td", {}, bar),
        el("td", {}, readMark(r.shares))));
    }
    holder.append(table);
  }

  if (a.features.length > 0) {
    holder.append(el("h4", { text: "Feature means" }));
    const table = el("table", { class: "features" });
    table.append(el("tr", {}, el("th", { text: "feature" }), el("th", { class: "num", text: "mean" }),
      el("th", { text: "unit" }), el("th", { text: "95 % band" }), el("th", { class: "num", text: "noise sd" }),
      el("th", { text: "readable?" }), el("th", { text: `last ${history.length} buckets` })));
    a.features.forEach((f, i) => {
      table.append(el("tr", { class: "feature" + (r.means && !r.means.readable ? " unreadable" : ""), "data-feature": f.name },
        el("td", { class: "name", text: f.name }),
        el("td", { class: "mean num", text: fmt(f.mean) }),
        el("td", { class: "unit", text: f.unit }),
        el("td", {}, band(f.mean - Z95 * f.sd, f.mean + Z95 * f.sd, fmt)),
        el("td", { class: "sd num", text: fmt(f.sd) }),
        el("td", {}, readMark(r.means)),
        el("td", { class: "history" }, sparkline(history, i))));
    });
    holder.append(table);
  }
  renderMode(cohort, worker);
  renderAttention(cohort, worker);
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

/** Gaze angle in degrees, signed ("+12°", "−24°", "0°"). */
function deg(x) {
  const v = Number(x.toFixed(1));
  return v === 0 ? "0°" : `${v > 0 ? "+" : "−"}${Math.abs(v)}°`;
}

/** The heatmap as a picture: one SVG rectangle per cell, coloured by the cohort's share of dwell
 * (viridis from 0 to the largest share), with the field's edges in degrees of gaze angle. */
function heatmap(m) {
  const nr = m.rows, nc = m.cols;
  const values = m.heatmap.flat();
  const hi = Math.max(...values);
  const cell = Math.max(8, Math.min(36, Math.floor(560 / Math.max(nr, nc))));
  const left = 44, top = 8, bottom = 18;
  const width = left + nc * cell + 24, height = top + nr * cell + bottom;
  const root = svg("svg", { class: "heatmap", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-rows": nr, "data-cols": nc });
  const [fw, fh] = m.fov_deg;
  const label = (x, y, text, anchor) => {
    const t = svg("text", { x, y, "text-anchor": anchor });
    t.textContent = text;
    root.append(t);
  };
  label(left - 4, top + 9, deg(fh / 2), "end");
  label(left - 4, top + nr * cell, deg(-fh / 2), "end");
  label(left, top + nr * cell + 13, deg(-fw / 2), "start");
  label(left + (nc * cell) / 2, top + nr * cell + 13, "0°", "middle");
  label(left + nc * cell, top + nr * cell + 13, deg(fw / 2), "end");
  m.heatmap.forEach((row, r) => {
    row.forEach((v, c) => {
      const rect = svg("rect", { class: "cell", x: left + c * cell, y: top + r * cell,
        width: cell - 1, height: cell - 1, "data-row": r, "data-col": c, "data-value": v,
        fill: colour(hi > 0 ? v / hi : 0) });
      const title = svg("title");
      const x0 = -fw / 2 + (c * fw) / nc, y0 = fh / 2 - (r * fh) / nr;
      title.textContent = `x ${deg(x0)} to ${deg(x0 + fw / nc)}, y ${deg(y0)} to ${deg(y0 - fh / nr)}: ` +
        `${pct(v)} % of the dwell (noisy sum ${fmt(m.grid[r][c])}, noise σ ${fmt(m.sigma)})`;
      rect.append(title);
      root.append(rect);
    });
  });
  return { root, hi };
}

/** What the page says when a worker has sent no attention: why, and what to enable. */
/** The buckets of a worker seen so far, from its aggregates, modes and attention. */
function bucketsSeen(key) {
  const seen = new Set();
  for (const m of [...(state.streams.get(key) || []), ...(state.modes.get(key) || [])]) seen.add(m.bucket);
  if (state.attention.has(key)) seen.add(state.attention.get(key).bucket);
  return seen.size;
}

function noAttention(cohort, worker) {
  const seen = bucketsSeen(cohort + "\u0000" + worker);
  const p = el("p", { class: "nodata" });
  const release = "cohort.release = [\"means\", \"attention\"] (or --cohort-release means,attention; " +
    "\"aois\" with cohort.attention_aois for named areas)";
  if (seen >= NO_ATTENTION_AFTER) {
    p.dataset.reason = "not-released";
    p.textContent = `This worker releases no attention: ${seen} of its buckets arrived ` +
      "without an attention message, so its cohort.release names neither \"attention\" (a dwell " +
      `heatmap over cohort.attention_grid) nor "aois". To see where the cohort looks, set ${release} ` +
      "on the workers; it takes part of the cohort's budget (each part's noise grows).";
  } else {
    p.dataset.reason = "waiting";
    p.textContent = "No attention message from this worker yet. A worker whose cohort.release " +
      "names \"attention\" or \"aois\" publishes one per bucket beside its aggregate, on " +
      `${state.prefix}/cohort/${cohort}/attention; if none comes with the next buckets, set ${release}.`;
  }
  return p;
}

function renderAttention(cohort, worker) {
  const holder = workerCard(cohort, worker).querySelector(".attention");
  const m = state.attention.get(cohort + "\u0000" + worker);
  holder.replaceChildren(el("h4", { text: "Attention" }));
  if (!m) {
    holder.append(noAttention(cohort, worker));
    return;
  }
  const r = m.readability || {};
  holder.append(el("p", { class: "note",
    text: `bucket ${m.bucket} (gaze ${clock(m.bucket_start)}–${clock(m.bucket_end)}), received ` +
      `${clock(m.received_at)}; about ${whole(Math.max(0, m.noisy_count))} sessions' gaze on the field ` +
      `(noisy ${fmt(m.noisy_count)}), noise σ ${fmt(m.sigma)}, ε ${fmt(m.epsilon_per_hour)} per hour (stated)` }));
  if (m.heatmap) {
    const figure = el("div", { class: "heatmap-figure" + (r.heatmap && !r.heatmap.readable ? " unreadable" : "") });
    const { root, hi } = heatmap(m);
    figure.append(el("p", { class: "caption" },
      `Share of the cohort's dwell per cell, ${m.rows} × ${m.cols} over ${fmt(m.fov_deg[0])}° × ${fmt(m.fov_deg[1])}° of gaze angle (row 0 on top) `,
      readMark(r.heatmap)));
    figure.append(root);
    figure.append(el("div", { class: "legend" }, el("span", { class: "min", text: "0 %" }),
      el("span", { class: "ramp" }), el("span", { class: "max", text: `${pct(hi)} %` })));
    if (!(hi > 0)) {
      figure.append(el("p", { class: "problem", text: "no cell's noisy sum is positive: the noise hides every cell" }));
    }
    holder.append(figure);
  }
  if (m.aois) {
    const total = m.aois.reduce((s, x) => s + Math.max(x.noisy_dwell, 0), 0);
    const table = el("table", { class: "aois" });
    table.append(el("tr", {}, el("th", { text: `area (${m.aoi_file})` }), el("th", { class: "num", text: "share %" }),
      el("th", { text: "95 % band, %" }), el("th", { text: "readable?" })));
    for (const x of m.aois) {
      const lo = total > 0 ? Math.min(1, Math.max(0, (x.noisy_dwell - Z95 * m.sigma) / total)) : null;
      const hi = total > 0 ? Math.min(1, Math.max(0, (x.noisy_dwell + Z95 * m.sigma) / total)) : null;
      table.append(el("tr", { class: "aoi" + (r.aois && !r.aois.readable ? " unreadable" : ""), "data-aoi": x.name },
        el("td", { class: "name", text: x.name }),
        el("td", { class: "share num", text: pct(x.share) }),
        el("td", {}, band(lo, hi, pct)),
        el("td", {}, readMark(r.aois))));
    }
    holder.append(table);
  }
}

// a categorical palette (Okabe–Ito), one colour per class in the model's order
const CLASS_COLOURS = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"];

function classColour(i) {
  return CLASS_COLOURS[i % CLASS_COLOURS.length];
}

/** The mode's readability marker: whether the bucket's sessions (from the same bucket's aggregate,
 * when the worker releases one) reach what a 10-point lead needs to be named right 9 times in 10. */
function modeMark(m, key) {
  const r = m.readability || {};
  const agg = (state.streams.get(key) || []).find((a) => a.bucket === m.bucket);
  const n = agg ? Math.max(0, agg.noisy_count) : null;
  const readable = n === null ? "unknown" : n >= r.sessions ? "yes" : "no";
  const text = readable === "yes" ? "readable" :
    readable === "no" ? `too few sessions: needs ≥ ${whole(r.sessions)}` :
    `readable from ≥ ${whole(r.sessions)} sessions`;
  const mark = el("span", { class: "readability", "data-readable": readable,
    "data-sessions": String(r.sessions), text });
  mark.title = `permute-and-flip names the true mode with probability ≥ 0.9 when it leads every other ` +
    `activity by ≥ ${fmt(m.lead_for_90)} sessions' worth of votes; with a 10-point lead that takes ` +
    `${whole(r.sessions)} sessions` + (n === null ? " (this worker publishes no session count)" :
      `; this bucket had about ${whole(n)}`);
  return mark;
}

/** The mode per bucket over time: one coloured column per bucket kept, the class's colour. */
function modeTimeline(history) {
  const classes = history[history.length - 1].classes;
  const first = history[0].bucket;
  const span = history[history.length - 1].bucket - first + 1;
  const h = 22, gap = 1, left = 0;
  const w = Math.max(3, Math.min(24, Math.floor(480 / span) - gap)); // a bucket's column, px
  const width = Math.max(left + span * (w + gap), 140), height = h + 14;
  const root = svg("svg", { class: "timeline", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-buckets": history.length });
  for (const m of history) {
    const x = left + (m.bucket - first) * (w + gap);
    const i = m.classes.indexOf(m.mode);
    const rect = svg("rect", { class: "slot", x, y: 0, width: w, height: h,
      fill: classColour(i < 0 ? classes.length : i), "data-bucket": m.bucket, "data-mode": m.mode });
    const title = svg("title");
    title.textContent = `bucket ${m.bucket} (gaze ${clock(m.bucket_start)}–${clock(m.bucket_end)}): ${m.mode}`;
    rect.append(title);
    root.append(rect);
  }
  const t0 = svg("text", { x: left, y: h + 11, "text-anchor": "start" });
  t0.textContent = clock(history[0].bucket_start);
  const t1 = svg("text", { x: width, y: h + 11, "text-anchor": "end" });
  t1.textContent = clock(history[history.length - 1].bucket_end);
  root.append(t0, t1);
  return root;
}

function renderMode(cohort, worker) {
  const key = cohort + "\u0000" + worker;
  const holder = workerCard(cohort, worker).querySelector(".mode");
  const history = state.modes.get(key) || [];
  holder.replaceChildren();
  if (!history.length) {
    if (bucketsSeen(key) >= NO_ATTENTION_AFTER) {
      holder.append(el("h4", { text: "Mode" }), el("p", { class: "nodata", "data-reason": "not-released",
        text: "This worker releases no mode (the group's dominant activity per bucket): set " +
          "cohort.release to include \"mode\" with a label model (cohort.model), e.g. " +
          "--cohort-release mode --cohort-model activity-portable." }));
    }
    return;
  }
  const m = history[history.length - 1];
  holder.append(el("h4", { text: "Mode: the group's dominant activity per bucket" }));
  holder.append(el("p", { class: "latest" }, `bucket ${m.bucket} (gaze ${clock(m.bucket_start)}–${clock(m.bucket_end)}): `,
    el("strong", { class: "value", text: m.mode }),
    ` (permute-and-flip among ${m.classes.length} classes of ${m.model}, ε ${fmt(m.epsilon)} per bucket) `,
    modeMark(m, key)));
  holder.append(modeTimeline(history));
  const legend = el("ul", { class: "classes" });
  m.classes.forEach((name, i) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = classColour(i);
    const count = history.filter((x) => x.mode === name).length;
    legend.append(el("li", { "data-class": name }, swatch, ` ${name} (${count} of ${history.length})`));
  });
  holder.append(legend);
}

function addMode(m) {
  const key = m.cohort + "\u0000" + m.worker;
  let history = state.modes.get(key);
  if (!history) state.modes.set(key, (history = []));
  if (history.some((h) => h.bucket === m.bucket)) return false;
  history.push(m);
  history.sort((p, q) => p.bucket - q.bucket);
  while (history.length > state.history) history.shift();
  return history.includes(m);
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
    connected: `broker ${b.address}: subscribed to ${state.prefix}/cohort/+/aggregates, …/attention and …/mode`,
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
  state.modes.clear();
  document.getElementById("topics").textContent = `${s.prefix}/cohort/+/aggregates`;
  for (const section of document.querySelectorAll("section.cohort")) section.remove();
  document.getElementById("empty").hidden = false;
  for (const a of s.aggregates) addAggregate(a);
  for (const m of s.attention) state.attention.set(m.cohort + "\u0000" + m.worker, m);
  for (const m of s.modes || []) addMode(m);
  const workers = new Map(); // every (cohort, worker) with any message
  for (const kept of [...state.streams.values(), ...state.modes.values()]) {
    const last = kept[kept.length - 1];
    workers.set(last.cohort + "\u0000" + last.worker, last);
  }
  for (const m of state.attention.values()) workers.set(m.cohort + "\u0000" + m.worker, m);
  for (const m of workers.values()) {
    renderWorker(m.cohort, m.worker);
    renderMode(m.cohort, m.worker);
    renderAttention(m.cohort, m.worker);
  }
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
    const m = JSON.parse(e.data);
    state.attention.set(m.cohort + "\u0000" + m.worker, m);
    renderAttention(m.cohort, m.worker);
  });
  source.addEventListener("mode", (e) => {
    const m = JSON.parse(e.data);
    if (addMode(m)) {
      renderMode(m.cohort, m.worker);
      if (!state.attention.has(m.cohort + "\u0000" + m.worker)) renderAttention(m.cohort, m.worker);
    }
  });
  source.addEventListener("broker", (e) => setBroker(JSON.parse(e.data)));
  source.addEventListener("invalid", (e) => setInvalid(JSON.parse(e.data)));
}

document.addEventListener("DOMContentLoaded", () => {
  connect();
  setInterval(updateAges, 1000);
});
