// masreplay trace viewer: agent lanes over time, drawn in SVG with no library and no network.
// Contract: every event mark is one element with data-event-id; critical-path marks carry
// data-critical="true"; coloured marks carry data-credit (the number they are coloured by).
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("masreplay-data").textContent);
  const TRACES = new Map(DATA.traces.map((trace) => [trace.id, trace]));
  const SCALE = DATA.scale;
  const LABEL_W = 180, ROW_H = 16, MIN_W = 3, LARGE = 300, CRITICAL = "critical path", SETTLE_MS = 150;
  // Two-sided scale: blue below 0, red above, a light neutral at 0; grey when uncredited.
  const NEUTRAL = [240, 240, 240], POSITIVE = [178, 24, 43], NEGATIVE = [33, 102, 172];
  const UNCREDITED = "rgb(168, 168, 168)";
  const TYPE_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#e15759", "#9c755f", "#bab0ac", "#ff9da7"];
  // Edge types by colour alone: a dashed stroke over thousands of segments costs Chromium
  // seconds per frame, a plain one milliseconds.
  const EDGE_COLOURS = {
    spawn: "#2e7d32", message: "#1e88e5", return: "#8e24aa", aggregate: "#ef6c00",
    tool_dependency: "#6d4c41", safety_flow: "#e53935", causal: "#9e9e9e", temporal: "#d6d6d6",
  };
  const edgeColour = (kind) => EDGE_COLOURS[kind] || "#888888";

  const $ = (id) => document.getElementById(id);
  const plot = $("plot"), chart = $("chart"), axis = $("axis");
  const state = { trace: null, k: 1, t0: 0, folded: new Set(), selected: -1, hiddenEdges: new Set(), marks: [], rowOf: [], frame: 0 };

  const esc = (value) => String(value).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const fmt = (value, digits = 4) => (value === null || value === undefined ? "—" : typeof value === "number" ? (Number.isInteger(value) ? String(value) : value.toPrecision(digits)) : String(value));

  function hashColour(name) {
    let h = 0;
    for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
    return TYPE_PALETTE[h % TYPE_PALETTE.length];
  }

  function creditColour(value) {
    if (value === null || !isFinite(value)) return UNCREDITED;
    const share = SCALE.max > 0 ? Math.min(1, Math.abs(value) / SCALE.max) : 0;
    const end = value >= 0 ? POSITIVE : NEGATIVE;
    const rgb = NEUTRAL.map((n, i) => Math.round(n + (end[i] - n) * share));
    return `rgb(${rgb[0]}, ${rgb[1]}, ${rgb[2]})`;
  }

  function lowConfidence(trace, i) {
    const credit = trace.credit, stderr = trace.stderr;
    return !!credit && credit[i] !== null && stderr[i] !== null && Math.abs(credit[i]) < 2 * stderr[i];
  }

  function eventColour(trace, i) {
    return trace.credit ? creditColour(trace.credit[i]) : hashColour(trace.types[trace.events.type[i]]);
  }

  // ---- layout -------------------------------------------------------------------------
  function timeRange(trace) {
    const { t, d } = trace.events;
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < t.length; i++) { lo = Math.min(lo, t[i]); hi = Math.max(hi, t[i] + (d[i] || 0)); }
    return lo === Infinity ? [0, 1] : [lo, hi > lo ? hi : lo + 1];
  }

  // The whole trace across the chart's width.
  function fitScale() {
    const [lo, hi] = timeRange(state.trace);
    state.k = Math.max(200, chart.clientWidth - LABEL_W - 24) / (hi - lo);
    state.t0 = lo;
  }

  function fit() {
    fitScale();
    schedule();
  }

  const xOf = (t) => LABEL_W + (t - state.t0) * state.k;

  // Row of each lane: its own when shown, its nearest shown ancestor's when folded away.
  function rows(trace) {
    const rowOf = new Array(trace.lanes.length), hidden = new Array(trace.lanes.length);
    let row = 0;
    trace.lanes.forEach((lane, i) => {
      const up = lane.parent;
      hidden[i] = up >= 0 && (hidden[up] || state.folded.has(up));
      rowOf[i] = hidden[i] ? rowOf[up] : row++;
    });
    return { rowOf, hidden, count: row };
  }

  function render() {
    const trace = state.trace;
    const { rowOf, hidden, count } = rows(trace);
    state.rowOf = rowOf;
    state.hidden = hidden;
    const height = count * ROW_H + 8;
    plot.setAttribute("height", height);
    const hasChildren = new Set(trace.lanes.map((lane) => lane.parent).filter((p) => p >= 0));
    // Stripes under everything; the label column over everything, so that marks panned
    // left of the time axis slide under the agents' names.
    const stripes = [], labels = [`<rect class="label-column" x="0" y="0" width="${LABEL_W}" height="${height}"></rect>`];
    trace.lanes.forEach((lane, i) => {
      if (hidden[i]) return;
      const y = rowOf[i] * ROW_H;
      if (rowOf[i] % 2 === 0) {
        stripes.push(`<rect class="lane-bg" x="0" y="${y}" width="100%" height="${ROW_H}"></rect>`);
        labels.push(`<rect class="lane-bg" x="0" y="${y}" width="${LABEL_W}" height="${ROW_H}"></rect>`);
      }
      const indent = 4 + Math.min(lane.depth, 6) * 10;
      if (hasChildren.has(i)) {
        labels.push(`<text class="fold" data-fold="${i}" x="${indent}" y="${y + 12}">${state.folded.has(i) ? "▸" : "▾"}</text>`);
      }
      labels.push(`<text class="lane-label${lane.tool ? " tool" : ""}" data-lane="${i}" x="${indent + 10}" y="${y + 12}">${esc(lane.agent.length > 24 ? lane.agent.slice(0, 23) + "…" : lane.agent)}</text>`);
    });
    const parts = ['<g class="stripes">', ...stripes, '</g><g class="moving"><g class="edges">'];
    for (const kind of trace.edge_types) {
      parts.push(`<path data-edge-type="${esc(kind)}" stroke="${edgeColour(kind)}"${state.hiddenEdges.has(kind) ? ' display="none"' : ""}></path>`);
    }
    parts.push(`<path class="critical-path"${state.hiddenEdges.has(CRITICAL) ? ' display="none"' : ""}></path></g><g class="marks">`);
    const critical = new Set(trace.critical);
    const ev = trace.events;
    for (let i = 0; i < ev.id.length; i++) {
      const lane = ev.lane[i];
      // A low-confidence mark is a thinner bar: as visible as a pattern, and cheap to draw.
      const low = lowConfidence(trace, i), inset = low ? 6 : 3;
      let attributes = `data-event-id="${esc(ev.id[i])}" data-i="${i}"`;
      if (critical.has(i)) attributes += ' data-critical="true"';
      if (trace.credit && trace.credit[i] !== null) attributes += ` data-credit="${trace.credit[i]}"`;
      if (low) attributes += ' data-low-confidence="true"';
      parts.push(`<rect class="mark${hidden[lane] ? " folded" : ""}" ${attributes} y="${rowOf[lane] * ROW_H + inset}" height="${ROW_H - 2 * inset}" fill="${eventColour(trace, i)}"></rect>`);
    }
    parts.push('</g><g class="branch-dots">');
    for (const index of new Set(trace.branches.map((branch) => branch.event))) {
      parts.push(`<circle class="branch-dot" data-branch-at="${index}" r="3"></circle>`);
    }
    parts.push('</g></g><g class="labels">', ...labels, "</g>");
    plot.innerHTML = parts.join("");
    state.marks = Array.from(plot.querySelectorAll(".marks > rect"));
    state.moving = plot.querySelector(".moving");
    state.dots = Array.from(plot.querySelectorAll(".branch-dot"));
    applyFilters();
    if (state.selected >= 0) state.marks[state.selected].classList.add("selected");
    layoutX();
  }

  // Horizontal positions only: what zoom and pan change, redone at most once a frame.
  function layoutX() {
    state.frame = 0;
    clearTimeout(state.settle);
    state.laidT0 = state.t0;
    state.laidK = state.k;
    state.moving.removeAttribute("transform");
    const trace = state.trace, ev = trace.events, rowOf = state.rowOf;
    const ends = new Float64Array(ev.t.length);
    state.marks.forEach((mark, i) => {
      const x = xOf(ev.t[i]), w = Math.max(MIN_W, (ev.d[i] || 0) * state.k);
      mark.setAttribute("x", x.toFixed(1));
      mark.setAttribute("width", w.toFixed(1));
      ends[i] = x + w;
    });
    const yOf = (i) => rowOf[ev.lane[i]] * ROW_H + ROW_H / 2;
    const segment = (s, d) => `M${ends[s].toFixed(1)} ${yOf(s)}L${xOf(ev.t[d]).toFixed(1)} ${yOf(d)}`;
    const paths = trace.edge_types.map(() => []);
    const [src, dst, kind] = trace.edges;
    for (let e = 0; e < src.length; e++) paths[kind[e]].push(segment(src[e], dst[e]));
    plot.querySelectorAll(".edges path[data-edge-type]").forEach((path, k) => path.setAttribute("d", paths[k].join("")));
    const path = trace.critical;
    const critical = [];
    for (let j = 1; j < path.length; j++) critical.push(segment(path[j - 1], path[j]));
    plot.querySelector(".critical-path").setAttribute("d", critical.join(""));
    for (const dot of state.dots) {
      const i = +dot.dataset.branchAt;
      dot.setAttribute("cx", xOf(ev.t[i]).toFixed(1));
      dot.setAttribute("cy", rowOf[ev.lane[i]] * ROW_H + 2);
    }
    drawAxis();
  }

  function schedule() {
    if (!state.frame) state.frame = requestAnimationFrame(layoutX);
  }

  function niceStep(span) {
    const raw = span / 8, power = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= raw);
  }

  function drawAxis() {
    const width = axis.clientWidth || chart.clientWidth;
    const lo = state.t0, hi = state.t0 + (width - LABEL_W) / state.k;
    const step = niceStep(hi - lo);
    const parts = [`<text class="axis-text" x="6" y="15">t (s)</text>`];
    for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) {
      const x = xOf(t).toFixed(1);
      parts.push(`<line class="axis-line" x1="${x}" x2="${x}" y1="16" y2="22"></line><text class="axis-text" x="${x}" y="13" text-anchor="middle">${+t.toPrecision(6)}</text>`);
    }
    axis.innerHTML = parts.join("");
  }

  function zoom(factor, atX) {
    const anchor = atX === undefined ? LABEL_W + (chart.clientWidth - LABEL_W) / 2 : atX;
    const t = state.t0 + (anchor - LABEL_W) / state.k;
    state.k *= factor;
    state.t0 = t - (anchor - LABEL_W) / state.k;
  }

  // During a gesture (drag, wheel) what was laid out moves as one transform, which costs the
  // compositor next to nothing at any size; the exact layout follows when the gesture stops.
  function preview() {
    const scale = state.k / state.laidK;
    const shift = LABEL_W * (1 - scale) + (state.laidT0 - state.t0) * state.k;
    state.moving.setAttribute("transform", `matrix(${scale} 0 0 1 ${shift.toFixed(1)} 0)`);
    drawAxis();
  }

  function settleSoon() {
    preview();
    clearTimeout(state.settle);
    state.settle = setTimeout(layoutX, SETTLE_MS);
  }

  // ---- panels ---------------------------------------------------------------------------
  function creditText(trace, i) {
    if (!trace.credit) return "—";
    const value = trace.credit[i];
    if (value === null) return "uncredited";
    const stderr = trace.stderr[i];
    let text = String(value);
    if (stderr !== null) text += ` ± ${fmt(stderr, 3)}`;
    if (lowConfidence(trace, i)) text += ' <span class="low">(low confidence: |credit| &lt; 2 stderr)</span>';
    return text;
  }

  function showEvent(i) {
    const trace = state.trace, event = trace.details[i], ev = trace.events;
    if (state.selected >= 0 && state.marks[state.selected]) state.marks[state.selected].classList.remove("selected");
    state.selected = i;
    state.marks[i].classList.add("selected");
    const known = new Set(["id", "agent", "type", "role", "t", "duration_s", "tokens", "reward"]);
    const [src, dst, kind] = trace.edges;
    const into = [], out = [];
    for (let e = 0; e < src.length; e++) {
      if (dst[e] === i) into.push(`${esc(ev.id[src[e]])} (${esc(trace.edge_types[kind[e]])})`);
      if (src[e] === i) out.push(`${esc(ev.id[dst[e]])} (${esc(trace.edge_types[kind[e]])})`);
    }
    const field = (name, value, key = name) => `<dt>${name}</dt><dd data-field="${key}">${value}</dd>`;
    const rest = Object.fromEntries(Object.entries(event).filter(([key]) => !known.has(key)));
    let html = "<h2>Event</h2><dl>" +
      field("id", esc(event.id)) + field("agent", esc(event.agent)) + field("type", esc(event.type)) +
      field("role", esc(event.role ?? "—")) + field("t", fmt(event.t, 6)) + field("duration_s", fmt(event.duration_s ?? null)) +
      field("tokens", fmt(event.tokens ?? null)) + field("reward", esc(event.reward ? JSON.stringify(event.reward) : "—")) +
      field(SCALE ? esc(SCALE.name) : "credit", creditText(trace, i), "credit") +
      field("critical path", trace.critical.includes(i) ? "yes" : "no") +
      field("from", into.join(", ") || "—") + field("to", out.join(", ") || "—") + "</dl>";
    if (Object.keys(rest).length) html += `<pre>${esc(JSON.stringify(rest, null, 1))}</pre>`;
    const here = trace.branches.filter((branch) => branch.event === i);
    if (here.length) html += "<h2>Branches here</h2>" + here.map(branchButton).join("");
    $("details").innerHTML = html;
  }

  function showAgent(laneIndex) {
    const trace = state.trace, lane = trace.lanes[laneIndex], ev = trace.events;
    // Its own events, and the tool results that answer its calls (which sit in its lane).
    let n = 0, results = 0, tokens = 0, credit = 0, credited = 0, first = Infinity, last = -Infinity;
    const roles = new Set();
    for (let i = 0; i < ev.id.length; i++) {
      if (ev.lane[i] !== laneIndex) continue;
      if (trace.details[i].agent === lane.agent) { n++; tokens += ev.tokens[i] || 0; } else results++;
      if (ev.role[i] >= 0) roles.add(trace.roles[ev.role[i]]);
      if (trace.credit && trace.credit[i] !== null) { credit += trace.credit[i]; credited++; }
      first = Math.min(first, ev.t[i]);
      last = Math.max(last, ev.t[i] + (ev.d[i] || 0));
    }
    const children = trace.lanes.filter((other) => other.parent === laneIndex).length;
    const field = (name, value) => `<dt>${name}</dt><dd data-field="${name}">${value}</dd>`;
    $("details").innerHTML = "<h2>Agent</h2><dl>" + field("agent", esc(lane.agent)) +
      field("spawned by", lane.parent >= 0 ? esc(trace.lanes[lane.parent].agent) : "—") +
      field("sub-agents", children) + field("roles", esc([...roles].join(", ") || "—")) + field("events", n) + field("tool results", results) +
      field("tokens", tokens) + field("credit sum", trace.credit ? `${fmt(credit, 6)} over ${credited} credited events` : "—") +
      field("active", n + results ? `${fmt(first, 6)} – ${fmt(last, 6)} s` : "never") + "</dl>";
  }

  function showMetrics() {
    const rows = Object.entries(state.trace.metrics).filter(([key]) => key !== "trace_id");
    $("metrics").innerHTML = rows.map(([key, value]) => `<tr><td>${esc(key)}</td><td data-metric="${esc(key)}">${fmt(value)}</td></tr>`).join("");
  }

  function rewardText(rewards) {
    const entries = Object.entries(rewards || {});
    return entries.length ? entries.map(([k, v]) => `${esc(k)} ${fmt(v, 3)}`).join(", ") : "no rewards";
  }

  function branchButton(branch) {
    const at = state.trace.events.id[branch.event];
    return `<button class="branch" data-switch="${esc(branch.trace_id)}">at ${esc(at)} · ${esc(branch.kind || "branch")} · ${rewardText(branch.rewards)}<br><small>${esc(branch.trace_id)}</small></button>`;
  }

  function showBranches() {
    const trace = state.trace, origin = trace.counterfactual_of;
    let html = "";
    if (origin && TRACES.has(origin.trace_id)) {
      html += `<p>This trace is a ${esc(origin.kind || "")} branch of <a class="switch" data-switch="${esc(origin.trace_id)}">${esc(origin.trace_id)}</a> at ${esc(origin.event_id)}.</p>`;
    }
    html += trace.branches.length ? trace.branches.map(branchButton).join("") : (origin ? "" : '<p class="hint">No branch rollouts of this trace in the batch.</p>');
    $("branches").innerHTML = html;
  }

  function drawThumbnail(canvas, trace) {
    const ratio = window.devicePixelRatio || 1, width = 148, height = 56;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    const context = canvas.getContext("2d");
    context.scale(ratio, ratio);
    const [lo, hi] = timeRange(trace), ev = trace.events;
    const lanes = Math.max(1, trace.lanes.length);
    for (let i = 0; i < ev.id.length; i++) {
      context.fillStyle = eventColour(trace, i);
      context.fillRect(2 + ((ev.t[i] - lo) / (hi - lo)) * (width - 6), 1 + (ev.lane[i] / lanes) * (height - 4), 2, Math.max(1, (height - 4) / lanes));
    }
  }

  function showSiblings() {
    const box = $("siblings");
    if (!box.childElementCount) {
      for (const id of DATA.siblings) {
        const trace = TRACES.get(id);
        const card = document.createElement("div");
        card.className = "sibling";
        card.dataset.traceId = id;
        card.title = id;
        card.innerHTML = `<canvas></canvas><div class="caption">${esc(id)}</div><div class="caption">${rewardText(trace.rewards)}</div>` +
          `<div class="caption">advantage ${trace.advantage === null ? "—" : fmt(trace.advantage, 3)} · ${trace.events.id.length} events</div>`;
        box.appendChild(card);
        drawThumbnail(card.querySelector("canvas"), trace);
      }
    }
    for (const card of box.children) card.classList.toggle("current", card.dataset.traceId === state.trace.id);
  }

  function showLegend() {
    const legend = $("legend");
    if (!SCALE) {
      const types = [...new Set(DATA.traces.flatMap((trace) => trace.types))];
      legend.innerHTML = "coloured by event type: " + types.map((type) => `<span><span class="swatch" style="background:${hashColour(type)}"></span>${esc(type)}</span>`).join(" ");
      return;
    }
    const stops = [-1, -0.5, 0, 0.5, 1].map((s, j) => `<stop offset="${j * 25}%" stop-color="${creditColour(s * (SCALE.max || 1))}"></stop>`).join("");
    const stderr = SCALE.median_stderr === null ? "" : ` · median stderr ${fmt(SCALE.median_stderr, 3)}`;
    legend.innerHTML =
      `<svg width="170" height="26" aria-label="colour scale"><defs><linearGradient id="credit-scale">${stops}</linearGradient></defs>` +
      `<rect x="5" y="2" width="160" height="10" fill="url(#credit-scale)" stroke="#888" stroke-width=".5"></rect>` +
      `<text class="axis-text" x="5" y="24">${fmt(-SCALE.max, 3)}</text><text class="axis-text" x="85" y="24" text-anchor="middle">0</text>` +
      `<text class="axis-text" x="165" y="24" text-anchor="end">+${fmt(SCALE.max, 3)}</text></svg>` +
      `<span class="scale-text"><b>${esc(SCALE.name)}</b>: ${esc(SCALE.estimator)}${SCALE.budget ? " · " + esc(SCALE.budget) : ""}${stderr} · ${SCALE.credited} credited</span>` +
      `<span><span class="swatch" style="background:${UNCREDITED}"></span>uncredited</span>` +
      `<span><span class="swatch low-swatch"></span>thin: |credit| &lt; 2 stderr</span>`;
  }

  function showEdgeLegend() {
    const kinds = [...new Set(DATA.traces.flatMap((trace) => trace.edge_types))];
    $("edge-legend").innerHTML = "edges: " + kinds.map((kind) => {
      return `<label><input type="checkbox" data-edge-toggle="${esc(kind)}"${state.hiddenEdges.has(kind) ? "" : " checked"}>` +
        `<svg width="22" height="8"><line x1="0" y1="4" x2="22" y2="4" stroke="${edgeColour(kind)}" stroke-width="2"></line></svg>${esc(kind)}</label>`;
    }).join("") + `<label><input type="checkbox" data-edge-toggle="${CRITICAL}"${state.hiddenEdges.has(CRITICAL) ? "" : " checked"}>` +
      '<svg width="22" height="8"><line x1="0" y1="4" x2="22" y2="4" stroke="#e6a100" stroke-width="3"></line></svg>critical path (marks outlined)</label>';
  }

  function fillFilters() {
    const trace = state.trace;
    const fill = (id, names, label) => {
      const select = $(id), chosen = select.value;
      select.innerHTML = `<option value="">${label}</option>` + names.map((name) => `<option${name === chosen ? " selected" : ""}>${esc(name)}</option>`).join("");
    };
    fill("filter-agent", trace.lanes.map((lane) => lane.agent), "all agents");
    fill("filter-role", trace.roles, "all roles");
    fill("filter-type", trace.types, "all types");
  }

  function applyFilters() {
    const trace = state.trace, ev = trace.events;
    const agent = $("filter-agent").value, role = $("filter-role").value, type = $("filter-type").value;
    const lane = trace.lanes.findIndex((l) => l.agent === agent), r = trace.roles.indexOf(role), k = trace.types.indexOf(type);
    state.marks.forEach((mark, i) => {
      const out = (agent && ev.lane[i] !== lane) || (role && ev.role[i] !== r) || (type && ev.type[i] !== k);
      mark.classList.toggle("filtered", !!out);
    });
  }

  function find(id) {
    const trace = state.trace, i = trace.events.id.indexOf(id);
    plot.querySelectorAll(".found").forEach((mark) => mark.classList.remove("found"));
    if (i < 0) {
      $("details").innerHTML = `<h2>Search</h2><p>No event <b>${esc(id)}</b> in ${esc(trace.id)}.</p>`;
      return;
    }
    let lane = trace.events.lane[i];
    while (state.hidden[lane]) lane = trace.lanes[lane].parent;
    chart.scrollTop = Math.max(0, state.rowOf[lane] * ROW_H - chart.clientHeight / 2);
    const x = xOf(trace.events.t[i]);
    if (x < LABEL_W || x > chart.clientWidth - 10) {
      const centred = trace.events.t[i] - (chart.clientWidth - LABEL_W) / (2 * state.k);
      state.t0 = Math.max(timeRange(trace)[0] - 10 / state.k, centred);  // never past the trace's start
    }
    layoutX();
    state.marks[i].classList.add("found");
    showEvent(i);
  }

  function switchTo(id) {
    const trace = TRACES.get(id);
    if (!trace) return;
    state.trace = trace;
    state.folded = new Set();
    // In a large trace, temporal edges (they only say "next in time") and the critical path's
    // line (its marks stay outlined) would hide everything else: off until asked for.
    if (trace.edges[0].length > LARGE) for (const kind of ["temporal", CRITICAL]) state.hiddenEdges.add(kind);
    plot.classList.toggle("large", trace.edges[0].length > LARGE);
    state.selected = -1;
    $("trace-title").textContent = id;
    $("trace-title").dataset.traceId = id;
    document.title = `masreplay · ${id}`;
    $("details").innerHTML = '<h2>Details</h2><p class="hint">Click an event for its fields and credit, an agent\'s name for its summary.</p>';
    fillFilters();
    fitScale();
    render();
    showMetrics();
    showSiblings();
    showBranches();
  }

  // ---- interaction ----------------------------------------------------------------------
  plot.addEventListener("click", (event) => {
    const target = event.target;
    if (target.dataset.i !== undefined) showEvent(+target.dataset.i);
    else if (target.dataset.lane !== undefined) showAgent(+target.dataset.lane);
    else if (target.dataset.fold !== undefined) {
      const lane = +target.dataset.fold;
      if (!state.folded.delete(lane)) state.folded.add(lane);
      render();
    }
  });
  document.addEventListener("click", (event) => {
    const target = event.target.closest("[data-switch], .sibling");
    if (target) switchTo(target.dataset.switch || target.dataset.traceId);
  });
  $("edge-legend").addEventListener("change", (event) => {
    const kind = event.target.dataset.edgeToggle;
    if (event.target.checked) state.hiddenEdges.delete(kind); else state.hiddenEdges.add(kind);
    plot.querySelectorAll(".edges path").forEach((path) => {
      if ((path.dataset.edgeType || CRITICAL) === kind) path.setAttribute("display", event.target.checked ? "inline" : "none");
    });
  });
  for (const id of ["filter-agent", "filter-role", "filter-type"]) $(id).addEventListener("change", applyFilters);
  $("search").addEventListener("keydown", (event) => { if (event.key === "Enter") find(event.target.value.trim()); });
  $("zoom-in").addEventListener("click", () => { zoom(1.5); schedule(); });
  $("zoom-out").addEventListener("click", () => { zoom(1 / 1.5); schedule(); });
  $("zoom-fit").addEventListener("click", fit);
  // Ctrl (or ⌘) + wheel zooms time around the pointer; shift + wheel pans it; a plain wheel scrolls the lanes.
  chart.addEventListener("wheel", (event) => {
    const box = chart.getBoundingClientRect();
    if (event.ctrlKey || event.metaKey) {
      event.preventDefault();
      zoom(Math.exp(-event.deltaY * 0.002), event.clientX - box.left);
      settleSoon();
    } else if (event.shiftKey || Math.abs(event.deltaX) > Math.abs(event.deltaY)) {
      event.preventDefault();
      state.t0 += (event.deltaX || event.deltaY) / state.k;
      settleSoon();
    }
  }, { passive: false });
  let drag = null;
  chart.addEventListener("pointerdown", (event) => {
    if (event.target.dataset.i !== undefined || event.target.dataset.lane !== undefined || event.target.dataset.fold !== undefined) return;
    drag = { x: event.clientX, t0: state.t0 };
    chart.classList.add("dragging");
  });
  window.addEventListener("pointermove", (event) => {
    if (!drag) return;
    state.t0 = drag.t0 - (event.clientX - drag.x) / state.k;
    preview();
  });
  window.addEventListener("pointerup", () => {
    if (!drag) return;
    drag = null;
    chart.classList.remove("dragging");
    layoutX();
  });
  window.addEventListener("resize", schedule);

  showLegend();
  switchTo(DATA.current);
  showEdgeLegend();
  document.body.dataset.ready = "true";
  // For benchmarks: scripts done, and the first frame after them (the page answers input).
  performance.mark("masreplay-ready");
  requestAnimationFrame(() => setTimeout(() => performance.mark("masreplay-interactive")));
})();
