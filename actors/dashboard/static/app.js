// The Lattica dashboard page: pictures of the mesh arrive on a server-sent event channel
// (/api/live); each one is drawn in full, tables built as one string per table.
"use strict";

const token = new URLSearchParams(location.search).get("token");
const withToken = (path) => (token ? `${path}?token=${encodeURIComponent(token)}` : path);
const MAX_ROWS = 500; // actor rows drawn at once (the filter narrows the rest)
const $ = (id) => document.getElementById(id);
let picture = null;
let previous = new Map(); // "node/actor" -> [time, calls] from the picture before
let rates = new Map();
let held = null; // the newest picture while updates are paused

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const short = (pid) => (pid ? "…" + esc(String(pid).slice(-8)) : "");
const num = (v) => (typeof v === "number" && Number.isFinite(v) ? String(v) : ""); // (numbers from peers: drawn only as numbers)
const list = (v) => (Array.isArray(v) ? v : []);
const cls = (v) => esc(String(v ?? "").replace(/[^a-z-]/gi, ""));
const bytes = (n) => {
  if (typeof n !== "number" || !Number.isFinite(n)) return "?";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
};
const body = (id, rows) => { $(id).tBodies[0].innerHTML = rows.join(""); };

function draw(pic) {
  picture = pic;
  const nodes = list(pic.nodes);
  const me = nodes.find((n) => n.self) || {};
  const rep = me.report || {};
  const nat = rep.nat || {};
  $("me").innerHTML =
    `<h2>This node <code data-self="${esc(me.peer_id)}">${esc(me.peer_id)}</code></h2>` +
    `<div>reachability <b class="${cls(nat.reachability)}">${esc(nat.reachability)}</b> — ${esc(nat.reason)}</div>` +
    `<div class="muted">${list(rep.addrs).map((a) => `<code>${esc(a)}</code>`).join(" ")}</div>`;

  let alive = 0, down = 0, actorCount = 0, direct = 0, relayed = 0;
  const now = pic.time;
  const nextCalls = new Map();
  const actorRows = [];
  const filter = $("filter").value.trim().toLowerCase();
  let matched = 0;
  const nodeRows = [], pathRows = [], dhtRows = [], docRows = [], transfers = [], trees = [];
  const topics = new Map();
  const restarts = new Map(); // "node/actor" -> restarts, from every supervisor's children
  for (const n of nodes) {
    for (const sup of list(n.report && n.report.supervisors)) {
      for (const c of list(sup.children)) {
        if (c.node && c.actor) restarts.set(`${c.node}/${c.actor}`, c.restarts);
      }
    }
  }
  for (const n of nodes) {
    const r = n.report;
    if (n.state === "alive" || n.state === "suspect") alive++; else down++;
    const load = n.load != null ? (typeof n.load === "object" ? JSON.stringify(n.load) : n.load) : "";
    nodeRows.push(
      `<tr data-node="${esc(n.peer_id)}" data-state="${esc(n.state)}">` +
      `<td><code title="${esc(n.peer_id)}">${short(n.peer_id)}</code>${n.self ? " (this)" : ""}</td>` +
      `<td class="${cls(n.state)}">${esc(n.state)}</td>` +
      `<td class="${cls(r && r.nat && r.nat.reachability)}">${esc(r && r.nat ? r.nat.reachability : "")}</td>` +
      `<td>${r ? num(r.actor_count) : ""}</td><td>${r ? list(r.peers).length : ""}</td><td>${esc(load)}</td>` +
      `<td>${num(n.cpu)}</td><td>${typeof n.memory === "number" ? bytes(n.memory) : ""}</td><td>${num(n.gpus)}</td>` +
      `<td>${esc(Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(" "))}</td>` +
      `<td class="muted">${n.error ? esc(n.error) : num(n.rtt_ms) ? `${num(n.rtt_ms)} ms` : ""}</td></tr>`);
    if (!r) continue;
    for (const a of list(r.actors)) {
      actorCount++;
      const key = `${n.peer_id}/${a.name}`;
      nextCalls.set(key, [now, a.calls]);
      const before = previous.get(key);
      const rate = before && now > before[0] && typeof a.calls === "number" ? Math.max(0, (a.calls - before[1]) / (now - before[0])) : rates.get(key);
      if (rate != null) rates.set(key, rate);
      if (filter && !(`${a.name} ${a.class} ${n.peer_id}`.toLowerCase().includes(filter))) continue;
      if (a.system && !filter) continue; // (system actors: shown when asked for by the filter)
      matched++;
      if (actorRows.length >= MAX_ROWS) continue;
      actorRows.push(
        `<tr data-actor="${esc(a.name)}" data-node="${esc(n.peer_id)}" data-state="${esc(a.state)}">` +
        `<td><code>${short(n.peer_id)}</code></td><td>${esc(a.name)}</td><td><code>${esc(a.class)}</code>` +
        (a.code ? ` <span class="muted" title="its code came from ${esc(a.code)}">code from <code>${short(a.code)}</code></span>` : "") +
        (a.job ? ` <span class="muted" title="it ends with the job ${esc(a.job)}">job <code>${short(a.job)}</code></span>` : "") + `</td>` +
        `<td class="${cls(a.state)}" title="${esc(a.failure || "")}">${esc(a.state)}</td><td>${num(a.mailbox)}</td><td>${num(a.running)}</td>` +
        `<td>${Number.isFinite(rate) ? rate.toFixed(1) : ""}</td><td>${num(a.calls)}</td><td>${num(a.errors)}</td>` +
        `<td data-restarts="${num(restarts.get(key))}">${num(restarts.get(key))}</td></tr>`);
    }
    for (const p of list(r.peers)) {
      if (p.path === "direct") direct++; else relayed++;
      pathRows.push(
        `<tr data-from="${esc(n.peer_id)}" data-to="${esc(p.peer_id)}" data-path="${esc(p.path)}">` +
        `<td><code>${short(n.peer_id)}</code></td><td><code>${short(p.peer_id)}</code></td>` +
        `<td class="${cls(p.path)}">${esc(p.path)}</td><td>${esc(p.transport)}</td><td>${esc(p.direction)}</td>` +
        `<td>${typeof p.rtt_ms === "number" ? p.rtt_ms.toFixed(2) + " ms" : ""}</td>` +
        `<td>${typeof p.bytes_sent === "number" ? bytes(p.bytes_sent) : ""}</td><td>${typeof p.bytes_received === "number" ? bytes(p.bytes_received) : ""}</td></tr>`);
    }
    if (r.dht) dhtRows.push(`<tr><td><code>${short(n.peer_id)}</code></td><td>${num(r.dht.table)}</td><td>${num(r.dht.records)}</td><td>${num(r.dht.rejected)}</td></tr>`);
    for (const t of list(r.content && r.content.transfers)) {
      const pct = typeof t.total === "number" && t.total > 0 && typeof t.bytes === "number" ? Math.min(100, (100 * t.bytes) / t.total) : 0;
      transfers.push(
        `<div data-transfer="${esc(t.cid)}"><code>${short(n.peer_id)}</code> ← <code>${esc(String(t.cid ?? "").slice(0, 16))}…</code> ` +
        `${bytes(t.bytes)} of ${bytes(t.total)} from ${num(t.peers)} peers<br><progress max="100" value="${pct.toFixed(1)}"></progress></div>`);
    }
    for (const t of list(r.pubsub && r.pubsub.topics)) {
      const row = topics.get(String(t.topic)) || { nodes: 0, mesh: 0 };
      row.nodes++; row.mesh += typeof t.mesh === "number" ? t.mesh : 0;
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
  $("actors-more").textContent = matched > actorRows.length ? `${matched - actorRows.length} more: narrow the filter to see them` : "";
  body("paths", pathRows);
  body("dht", dhtRows);
  body("docs", docRows);
  body("topics", [...topics].sort().map(([t, v]) => `<tr><td>${esc(t)}</td><td>${num(v.nodes)}</td><td>${num(v.mesh)}</td></tr>`));
  $("transfers").innerHTML = transfers.join("") || `<p class="muted">none running</p>`;
  $("trees").innerHTML = trees.join("") || `<p class="muted">no supervisor runs</p>`;
  $("summary").innerHTML =
    `<div><b data-count="alive">${alive}</b>nodes up</div><div><b data-count="down">${down}</b>down or left</div>` +
    `<div><b data-count="actors">${actorCount}</b>actors</div><div><b>${direct}</b>direct paths</div><div><b>${relayed}</b>relayed</div>`;
  $("events").innerHTML = list(pic.events).slice(-200).reverse().map((e) =>
    `<li class="${cls(e.kind)}" data-kind="${esc(e.kind)}">${esc(new Date(e.time * 1000).toLocaleTimeString())} — ${esc(e.text)}</li>`).join("");
}

function tree(node, sup) {
  const kids = list(sup.children).map((c) =>
    `<li data-child="${esc(c.id)}" data-node="${esc(c.node || "")}" data-restarts="${num(c.restarts)}">` +
    `<b>${esc(c.id)}</b> <code>${esc(c.class)}</code> ${c.node ? `on <code>${short(c.node)}</code>` : `<span class="failed">not running</span>`}` +
    ` <span class="muted">${esc(c.restart)}, restarts ${num(c.restarts)}</span></li>`).join("");
  return `<div data-supervisor="${esc(sup.name)}"><b>${esc(sup.name)}</b> <span class="muted">${esc(sup.strategy)} on ${short(node.peer_id)}</span><ul class="tree">${kids}</ul></div>`;
}

function connect() {
  const status = $("status");
  const source = new EventSource(withToken("/api/live"));
  source.addEventListener("picture", (ev) => {
    try {
      held = JSON.parse(ev.data);
      if (!$("pause").checked) { draw(held); held = null; }
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
$("pause").addEventListener("change", () => { if (!$("pause").checked && held) { redraw(held); held = null; } });
fetch(withToken("/api/mesh")).then((r) => (r.ok ? r.json() : null)).then((pic) => { if (pic && !picture) redraw(pic); }).catch(() => {});
connect();
