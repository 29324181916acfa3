// The Lattica dashboard page: pictures of the mesh arrive on a server-sent event channel
// (/api/live); each one is drawn in full, tables built as one string per table. What one actor
// or node holds (errors with tracebacks, output, utilisation series) is asked of its node on
// demand (/api/actor, /api/series) while its panel is open.
"use strict";

const token = new URLSearchParams(location.search).get("token");
const api = (path, params = {}) => {
  const q = new URLSearchParams(params);
  if (token) q.set("token", token);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
};
const MAX_ROWS = 500; // actor rows drawn at once (the filter narrows the rest)
const $ = (id) => document.getElementById(id);
let picture = null;
let previous = new Map(); // "node/actor" -> [time, calls] from the picture before
let rates = new Map();
let held = null; // the newest picture while updates are paused
let selected = null; // {kind: "actor", node, name} or {kind: "node", node}: the open panel
let jobFilter = null; // a job's driver node: the actors table shows that job's actors

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const short = (pid) => (pid ? "…" + esc(String(pid).slice(-8)) : "");
const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const num = (v) => (isNum(v) ? String(v) : ""); // (numbers from peers: drawn only as numbers)
const list = (v) => (Array.isArray(v) ? v : []);
const cls = (v) => esc(String(v ?? "").replace(/[^a-z-]/gi, ""));
const bytes = (n) => {
  if (!isNum(n)) return "?";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
};
const rate = (v) => (isNum(v) ? (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) : "");
const pct = (v) => (isNum(v) ? `${v.toFixed(v >= 10 ? 0 : 1)} %` : "");
const clock = (t) => (isNum(t) ? new Date(t * 1000).toLocaleTimeString() : "");
const body = (id, rows) => { $(id).tBodies[0].innerHTML = rows.join(""); };
const userActors = (r) => list(r && r.actors).filter((a) => !a.system);

// A node's gossiped load as words: "3 actors; cpu 2 reserved".
function load(l) {
  if (isNum(l)) return String(l);
  if (!l || typeof l !== "object") return "";
  const parts = [];
  if (isNum(l.actors)) parts.push(`${l.actors} actor${l.actors === 1 ? "" : "s"}`);
  const kept = Object.entries(l.reserved || {}).filter(([, v]) => isNum(v) && v > 0).map(([k, v]) => `${esc(k)} ${v}`);
  if (kept.length) parts.push(`${kept.join(", ")} reserved`);
  return parts.join("; ");
}

// Reachability as the user should read it: "unknown" on a loopback-only node is no warning.
function reach(nat) {
  if (!nat) return ["", "", ""];
  if (nat.loopback && nat.reachability === "unknown") {
    return ["loopback only", "loopback",
      "this node listens only on loopback: nothing outside this machine can reach it, so there is no reachability to check (listen on a LAN or public address to see it)"];
  }
  return [nat.reachability, nat.reachability, nat.reason];
}

// A small line chart of one series (SVG, no library): the newest value and the peak beside it.
function chart(title, times, values, fmt) {
  const pts = [];
  const vals = list(values).map((v) => (isNum(v) && v >= 0 ? v : null));
  const ts = list(times);
  const W = 260, H = 56;
  const max = Math.max(1e-9, ...vals.filter((v) => v !== null));
  const t0 = ts[0], t1 = ts[ts.length - 1];
  vals.forEach((v, i) => {
    if (v === null || !isNum(ts[i])) return;
    const x = t1 > t0 ? ((ts[i] - t0) / (t1 - t0)) * W : W;
    pts.push(`${x.toFixed(1)},${(H - 2 - (v / max) * (H - 6)).toFixed(1)}`);
  });
  const last = vals.length ? vals[vals.length - 1] : null;
  const line = pts.length ? `<polyline points="${pts.join(" ")}" fill="none" stroke="#2563eb" stroke-width="2"/>` : "";
  const empty = pts.length ? "" : `<text x="8" y="32" fill="#6b7280" font-size="12">no samples yet</text>`;
  return `<figure class="chart" data-chart="${esc(title)}" data-points="${pts.length}"><figcaption>${esc(title)}` +
    ` <b>${last === null ? "—" : esc(fmt(last))}</b> <span class="muted">peak ${pts.length ? esc(fmt(max)) : "—"}</span></figcaption>` +
    `<svg viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="${esc(title)}">` +
    `<rect x="0" y="0" width="${W}" height="${H}" fill="#f8fafc" stroke="#e5e7eb"/>${line}${empty}</svg></figure>`;
}

function draw(pic) {
  picture = pic;
  const nodes = list(pic.nodes);
  const me = nodes.find((n) => n.self) || {};
  const rep = me.report || {};
  const [rtext, rclass, rwhy] = reach(rep.nat);
  $("me").innerHTML =
    `<h2>This node <code data-self="${esc(me.peer_id)}">${esc(me.peer_id)}</code></h2>` +
    `<div data-reachability="${esc(rclass)}">reachability <b class="${cls(rclass)}">${esc(rtext)}</b> — ${esc(rwhy)}</div>` +
    `<div class="muted">${list(rep.addrs).map((a) => `<code>${esc(a)}</code>`).join(" ")}</div>`;

  let alive = 0, down = 0, userCount = 0, systemCount = 0, direct = 0, relayed = 0, errorsPerS = 0;
  const now = pic.time;
  const nextCalls = new Map();
  const actorRows = [];
  const filter = $("filter").value.trim().toLowerCase();
  const showSystem = $("show-system").checked;
  let matched = 0;
  const nodeRows = [], pathRows = [], dhtRows = [], docRows = [], transfers = [], trees = [], endedRows = [];
  const topics = new Map();
  const restarts = new Map(); // "node/actor" -> restarts, from every supervisor's children
  const supervised = new Set();
  const jobs = new Map(); // driver node -> {actors, nodes, errors, failed}
  const byId = new Map(nodes.map((n) => [n.peer_id, n]));
  for (const n of nodes) {
    for (const sup of list(n.report && n.report.supervisors)) {
      for (const c of list(sup.children)) {
        if (c.node && c.actor) { restarts.set(`${c.node}/${c.actor}`, c.restarts); supervised.add(`${c.node}/${c.actor}`); }
      }
    }
  }
  for (const n of nodes) {
    const r = n.report;
    if (n.state === "alive" || n.state === "suspect") alive++; else down++;
    const users = userActors(r);
    const system = r ? list(r.actors).length - users.length : 0;
    userCount += users.length;
    systemCount += system;
    const u = (r && r.usage) || {};
    if (isNum(u.errors)) errorsPerS += u.errors;
    const [nt, nc, nwhy] = reach(r && r.nat);
    nodeRows.push(
      `<tr data-node="${esc(n.peer_id)}" data-state="${esc(n.state)}" class="pick" title="click: this node's utilisation">` +
      `<td><code title="${esc(n.peer_id)}">${short(n.peer_id)}</code>${n.self ? " (this)" : ""}</td>` +
      `<td class="${cls(n.state)}">${esc(n.state)}</td>` +
      `<td class="${cls(nc)}" title="${esc(nwhy)}">${esc(nt)}</td>` +
      `<td data-actors="${r ? users.length : ""}">${r ? users.length : ""}</td><td class="muted">${r ? system : ""}</td>` +
      `<td>${r ? list(r.peers).length : ""}</td><td>${load(n.load)}</td>` +
      `<td>${pct(u.cpu)}</td><td>${isNum(u.memory) ? bytes(u.memory) : ""}</td><td>${rate(u.calls)}</td>` +
      `<td class="${u.errors > 0 ? "failed" : ""}">${rate(u.errors)}</td>` +
      `<td>${num(n.cpu)}${isNum(n.gpus) && n.gpus ? ` + ${n.gpus} gpu` : ""}${isNum(n.memory) ? `, ${bytes(n.memory)}` : ""}</td>` +
      `<td class="labels">${esc(Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(" "))}</td>` +
      `<td class="muted">${n.error ? esc(n.error) : num(n.rtt_ms) ? `${num(n.rtt_ms)} ms` : ""}</td></tr>`);
    if (!r) continue;
    for (const a of list(r.actors)) {
      const key = `${n.peer_id}/${a.name}`;
      nextCalls.set(key, [now, a.calls]);
      const before = previous.get(key);
      const cps = before && now > before[0] && isNum(a.calls) ? Math.max(0, (a.calls - before[1]) / (now - before[0])) : rates.get(key);
      if (cps != null) rates.set(key, cps);
      const job = a.job || n.peer_id;
      if (!a.system) {
        const j = jobs.get(job) || { actors: 0, nodes: new Set(), errors: 0, own: !a.job };
        j.actors++; j.nodes.add(n.peer_id); j.errors += isNum(a.errors) ? a.errors : 0;
        jobs.set(job, j);
      }
      if (jobFilter && (a.system || job !== jobFilter)) continue;
      if (filter && !(`${a.name} ${a.class} ${n.peer_id}`.toLowerCase().includes(filter))) continue;
      if (a.system && !showSystem) continue;
      matched++;
      if (actorRows.length >= MAX_ROWS) continue;
      const le = a.last_error;
      const sel = selected && selected.kind === "actor" && selected.node === n.peer_id && selected.name === a.name ? " selected" : "";
      actorRows.push(
        `<tr data-actor="${esc(a.name)}" data-node="${esc(n.peer_id)}" data-state="${esc(a.state)}" class="pick${sel}" title="click: errors, output and utilisation">` +
        `<td><code>${short(n.peer_id)}</code></td><td>${esc(a.name)}${a.system ? ' <span class="muted">system</span>' : ""}</td>` +
        `<td><code>${esc(a.class)}</code></td>` +
        `<td class="${cls(a.state)}" title="${esc(a.failure || "")}">${esc(a.state)}</td><td>${num(a.mailbox)}</td><td>${num(a.running)}</td>` +
        `<td>${Number.isFinite(cps) ? cps.toFixed(1) : ""}</td><td>${num(a.calls)}</td><td class="${a.errors > 0 ? "failed" : ""}">${num(a.errors)}</td>` +
        `<td class="last-error" title="${le ? esc(`${le.method}: ${le.type}: ${le.message}`) : ""}">${le ? `<span class="failed">${esc(le.type)}</span> ${esc(le.message)}` : ""}</td>` +
        `<td>${isNum(a.output) && a.output ? a.output : ""}</td>` +
        `<td data-restarts="${num(restarts.get(key))}">${num(restarts.get(key))}</td></tr>`);
    }
    for (const e of list(r.ended)) {
      endedRows.push([e.ended, `<tr data-actor="${esc(e.name)}" data-node="${esc(n.peer_id)}" data-state="${esc(e.state)}" class="pick" title="click: why it ended">` +
        `<td>${esc(clock(e.ended))}</td><td><code>${short(n.peer_id)}</code></td><td>${esc(e.name)}</td><td><code>${esc(e.class)}</code></td>` +
        `<td class="${cls(e.state)}">${esc(e.state)}</td><td class="reason" title="${esc(e.reason)}">${esc(e.reason)}</td><td>${num(e.errors)}</td></tr>`]);
    }
    for (const p of list(r.peers)) {
      if (p.path === "direct") direct++; else relayed++;
      pathRows.push(
        `<tr data-from="${esc(n.peer_id)}" data-to="${esc(p.peer_id)}" data-path="${esc(p.path)}">` +
        `<td><code>${short(n.peer_id)}</code></td><td><code>${short(p.peer_id)}</code></td>` +
        `<td class="${cls(p.path)}">${esc(p.path)}</td><td>${esc(p.transport)}</td><td>${esc(p.direction)}</td>` +
        `<td>${isNum(p.rtt_ms) ? p.rtt_ms.toFixed(2) + " ms" : ""}</td>` +
        `<td>${isNum(p.bytes_sent) ? bytes(p.bytes_sent) : ""}</td><td>${isNum(p.bytes_received) ? bytes(p.bytes_received) : ""}</td></tr>`);
    }
    if (r.dht) dhtRows.push(`<tr><td><code>${short(n.peer_id)}</code></td><td>${num(r.dht.table)}</td><td>${num(r.dht.records)}</td><td>${num(r.dht.rejected)}</td></tr>`);
    for (const t of list(r.content && r.content.transfers)) {
      const p = isNum(t.total) && t.total > 0 && isNum(t.bytes) ? Math.min(100, (100 * t.bytes) / t.total) : 0;
      transfers.push(
        `<div data-transfer="${esc(t.cid)}"><code>${short(n.peer_id)}</code> ← <code>${esc(String(t.cid ?? "").slice(0, 16))}…</code> ` +
        `${bytes(t.bytes)} of ${bytes(t.total)} from ${num(t.peers)} peers${t.kinds ? " (" + esc(t.kinds) + ")" : ""}<br><progress max="100" value="${p.toFixed(1)}"></progress></div>`);
    }
    for (const t of list(r.pubsub && r.pubsub.topics)) {
      const row = topics.get(String(t.topic)) || { nodes: 0, mesh: 0 };
      row.nodes++; row.mesh += isNum(t.mesh) ? t.mesh : 0;
      topics.set(String(t.topic), row);
    }
    for (const d of list(r.crdt && r.crdt.docs)) {
      docRows.push(`<tr><td>${esc(d.name || d.id)}</td><td><code>${short(n.peer_id)}</code></td><td>${num(d.applied)}</td><td>${num(d.refused)}</td><td>${num(d.peers)}</td></tr>`);
    }
    for (const s of list(r.supervisors)) trees.push(tree(n, s));
  }
  previous = nextCalls;
  body("nodes", nodeRows);
  body("actors", actorRows);
  const more = matched > actorRows.length ? `${matched - actorRows.length} more: narrow the filter to see them` : "";
  $("actors-more").textContent = jobFilter ? `only the actors of job …${String(jobFilter).slice(-8)} — ${more || "click the job again to see all"}` : more;
  body("ended", endedRows.sort((a, b) => (b[0] || 0) - (a[0] || 0)).slice(0, 200).map((e) => e[1]));
  body("jobs", [...jobs].sort((a, b) => b[1].actors - a[1].actors).map(([job, j]) => jobRow(job, j, byId.get(job))));
  body("paths", pathRows);
  body("dht", dhtRows);
  body("docs", docRows);
  const showInternal = $("show-internal").checked;
  const internal = [...topics.keys()].filter((t) => t.startsWith("lattica/"));
  body("topics", [...topics].filter(([t]) => showInternal || !t.startsWith("lattica/")).sort()
    .map(([t, v]) => `<tr><td>${esc(t)}</td><td>${num(v.nodes)}</td><td>${num(v.mesh)}</td></tr>`));
  $("topics-hidden").textContent = internal.length && !showInternal ? `${internal.length} internal topic${internal.length === 1 ? "" : "s"} (CRDT documents) hidden` : "";
  $("transfers").innerHTML = transfers.join("") || `<p class="muted">none running</p>`;
  $("trees").innerHTML = trees.join("") || `<p class="muted">no supervisor runs</p>`;
  $("summary").innerHTML =
    `<div><b data-count="alive">${alive}</b>nodes up</div><div><b data-count="down">${down}</b>down or left</div>` +
    `<div><b data-count="actors">${userCount}</b>actors</div><div><b data-count="system">${systemCount}</b>system actors</div>` +
    `<div><b data-count="jobs">${jobs.size}</b>jobs</div><div><b data-count="errors">${rate(errorsPerS) || "0"}</b>errors/s</div>` +
    `<div><b>${direct}</b>direct paths</div><div><b>${relayed}</b>relayed</div>`;
  $("events").innerHTML = list(pic.events).slice(-200).reverse().map((e) =>
    `<li class="${cls(e.kind)}" data-kind="${esc(e.kind)}">${esc(clock(e.time))} — ${esc(e.text)}</li>`).join("");
}

function jobRow(job, j, driver) {
  const rep = driver && driver.report;
  const state = driver ? driver.state : "not a member";
  const what = j.own ? "the node itself (or detached)" : rep ? `${esc(rep.program || "?")} <span class="muted">pid ${num(rep.pid)}</span>` : "";
  return `<tr data-job="${esc(job)}" class="pick${jobFilter === job ? " selected" : ""}" title="click: show only this job's actors">` +
    `<td><code title="${esc(job)}">${short(job)}</code></td><td>${what}</td><td class="${cls(state)}">${esc(state)}</td>` +
    `<td>${j.actors}</td><td>${j.nodes.size}</td><td class="${j.errors > 0 ? "failed" : ""}">${j.errors}</td></tr>`;
}

function tree(node, sup) {
  const kids = list(sup.children).map((c) =>
    `<li data-child="${esc(c.id)}" data-node="${esc(c.node || "")}" data-restarts="${num(c.restarts)}">` +
    `<b>${esc(c.id)}</b> <code>${esc(c.class)}</code> ${c.node ? `on <code>${short(c.node)}</code>` : `<span class="failed">not running</span>`}` +
    ` <span class="muted">${esc(c.restart)}, restarts ${num(c.restarts)}</span></li>`).join("");
  return `<div data-supervisor="${esc(sup.name)}"><b>${esc(sup.name)}</b> <span class="muted">${esc(sup.strategy)} on ${short(node.peer_id)}</span><ul class="tree">${kids}</ul></div>`;
}

// -- the panel: one actor's or one node's detail, asked of its node --------------------------------

async function showDetail() {
  const panel = $("detail");
  if (!selected) { panel.hidden = true; panel.innerHTML = ""; return; }
  const asked = selected;
  const path = asked.kind === "actor" ? api("/api/actor", { node: asked.node, name: asked.name }) : api("/api/series", { node: asked.node });
  let got = null, why = "";
  try {
    const r = await fetch(path);
    if (r.ok) got = await r.json(); else why = await r.text();
  } catch (err) { why = String(err); }
  if (selected !== asked) return; // (another was picked meanwhile)
  panel.hidden = false;
  const close = `<button id="detail-close" type="button" aria-label="close">close</button>`;
  if (!got) {
    panel.innerHTML = `<h2>${asked.kind === "actor" ? `Actor ${esc(asked.name)}` : `Node ${short(asked.node)}`} ${close}</h2><p class="failed">${esc(why)}</p>`;
    return;
  }
  const out = panel.querySelector("pre.output");
  const following = !out || out.scrollTop + out.clientHeight >= out.scrollHeight - 4; // (kept at the newest line unless scrolled up)
  const kept = out ? out.scrollTop : 0;
  panel.innerHTML = asked.kind === "actor" ? actorPanel(asked, got, close) : nodePanel(asked, got, close);
  panel.dataset.kind = asked.kind;
  const now = panel.querySelector("pre.output");
  if (now) now.scrollTop = following ? now.scrollHeight : kept;
  panel.dataset.loaded = String(Date.now());
}

function actorPanel(asked, d, close) {
  const node = picture && list(picture.nodes).find((n) => n.peer_id === asked.node);
  const row = node && node.report ? list(node.report.actors).find((a) => a.name === asked.name) : null;
  const s = d.series;
  const charts = s ? [chart("calls/s", s.time, s.calls, rate), chart("errors/s", s.time, s.errors, rate),
    list(s.cpu).some((v) => isNum(v) && v >= 0) ? chart("cpu (its thread)", s.time, s.cpu, pct) : "",
    chart("mailbox", s.time, s.mailbox, (v) => v.toFixed(0)),
    chart("memory it holds (estimate)", s.time, s.memory, bytes)].join("") : `<p class="muted">no series: it ended</p>`;
  const mem = d.memory;
  const errs = list(d.recent_errors).slice().reverse().map((e) =>
    `<li data-error="${esc(e.type)}"><div><span class="muted">${esc(clock(e.time))}</span> <code>${esc(e.method)}</code> ` +
    `<b class="failed">${esc(e.type)}</b>: ${esc(e.message)}</div>${e.traceback ? `<details open><summary>traceback</summary><pre>${esc(e.traceback)}</pre></details>` : ""}</li>`).join("");
  const out = list(d.output).map((l) => `<span class="out-${cls(l[1])}" data-stream="${esc(l[1])}">${esc(clock(l[0]))} ${esc(l[1]).padEnd(6)} ${esc(l[2])}</span>`).join("\n");
  return `<h2>Actor <code>${esc(d.name)}</code> <span class="${cls(d.state)}">${esc(d.state)}</span> ${close}</h2>` +
    `<div class="facts"><span>class <code>${esc(d.class)}</code></span><span>on <code title="${esc(asked.node)}">${short(asked.node)}</code></span>` +
    `<span>calls ${num(d.calls)}</span><span>errors ${num(d.errors)}</span><span>since ${esc(clock(d.started))}</span>` +
    (mem && isNum(mem.bytes) ? `<span data-memory="${num(mem.bytes)}" title="arrays, tensors, buffers and objects its attributes reach, each counted once` +
      ` (${num(mem.objects)} objects${mem.complete ? "" : ", stopped at the bound"}): Python keeps no heap per actor">holds ≈ ${bytes(mem.bytes)}</span>` : "") +
    (d.ended ? `<span>ended ${esc(clock(d.ended))}: ${esc(d.reason)}</span>` : "") +
    (row && row.job ? `<span>job <code title="${esc(row.job)}">${short(row.job)}</code></span>` : "") +
    (row && row.code ? `<span>code from <code title="${esc(row.code)}">${short(row.code)}</code></span>` : "") + `</div>` +
    `<div class="charts">${charts}</div>` +
    (d.failure ? `<h3>Why it failed</h3><div class="failed">${esc(d.failure[0])}: ${esc(d.failure[1])}</div><pre>${esc(d.failure[2])}</pre>` : "") +
    `<h3>Last errors <span class="muted">(${list(d.recent_errors).length}, newest first)</span></h3>` +
    (errs ? `<ol class="errors">${errs}</ol>` : `<p class="muted">none</p>`) +
    `<h3>Output <span class="muted">(stdout, stderr and log records while its code ran${d.dropped ? `; ${num(d.dropped)} older lines dropped` : ""})</span></h3>` +
    (out ? `<pre class="output">${out}</pre>` : `<p class="muted">nothing printed or logged</p>`);
}

function nodePanel(asked, s, close) {
  const node = picture && list(picture.nodes).find((n) => n.peer_id === asked.node);
  const rep = (node && node.report) || {};
  return `<h2>Node <code>${esc(asked.node)}</code> ${close}</h2>` +
    `<div class="facts"><span>${esc(rep.program || "")}</span><span>pid ${num(rep.pid)}</span><span>${esc(rep.agent || "")}</span>` +
    `<span>samples every ${num(s.every)} s, the last ${list(s.time).length}</span></div>` +
    `<div class="charts">${chart("cpu (% of one core)", s.time, s.cpu, pct)}${chart("memory (resident)", s.time, s.memory, bytes)}` +
    `${chart("calls/s", s.time, s.calls, rate)}${chart("errors/s", s.time, s.errors, rate)}</div>`;
}

function pick(next) {
  const same = selected && next && selected.kind === next.kind && selected.node === next.node && selected.name === next.name;
  selected = same ? null : next;
  if (picture) redraw(picture);
  showDetail();
}

function connect() {
  const status = $("status");
  const source = new EventSource(api("/api/live"));
  source.addEventListener("picture", (ev) => {
    try {
      held = JSON.parse(ev.data);
      if (!$("pause").checked) { draw(held); held = null; if (selected) showDetail(); }
      status.dataset.live = "live";
      status.textContent = `live — ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      status.dataset.live = "lost";
      status.textContent = `a picture could not be drawn: ${err}`;
    }
  });
  source.onerror = () => {
    status.dataset.live = "lost";
    status.textContent = "connection lost: retrying…";
  };
}

const redraw = (pic) => { try { draw(pic); } catch (err) { $("status").dataset.live = "lost"; $("status").textContent = `a picture could not be drawn: ${err}`; } };
$("filter").addEventListener("input", () => { if (picture) redraw(picture); });
$("show-system").addEventListener("change", () => { if (picture) redraw(picture); });
$("show-internal").addEventListener("change", () => { if (picture) redraw(picture); });
$("pause").addEventListener("change", () => { if (!$("pause").checked && held) { redraw(held); held = null; } });
document.addEventListener("click", (ev) => {
  const t = ev.target instanceof Element ? ev.target : null;
  if (!t) return;
  if (t.closest("#detail-close")) { pick(null); return; }
  const row = t.closest("tr.pick");
  if (!row) return;
  if (row.dataset.job) { jobFilter = jobFilter === row.dataset.job ? null : row.dataset.job; if (picture) redraw(picture); return; }
  if (row.dataset.actor) pick({ kind: "actor", node: row.dataset.node, name: row.dataset.actor });
  else if (row.dataset.node) pick({ kind: "node", node: row.dataset.node });
});
fetch(api("/api/mesh")).then((r) => (r.ok ? r.json() : null)).then((pic) => { if (pic && !picture) redraw(pic); }).catch(() => {});
connect();
