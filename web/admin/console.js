// The admin console: sign in with the admin token (kept in sessionStorage,
// sent as a Bearer header), manage campaigns through /admin/v1, and watch
// one sale live over its stats stream. The stream is read with fetch(), not
// EventSource, because EventSource cannot send the Authorization header
// and the token must never appear in a URL (logs, history, Referer).

const $ = (id) => document.getElementById(id);
const tokenKey = "flashsale.admin.token";
const chartPoints = 60;

let token = sessionStorage.getItem(tokenKey) || "";
let watching = null; // {id, abort}
// Read by the browser tests: events received, the last one.
window.flashsaleConsole = { events: 0, last: null };

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: { Authorization: "Bearer " + token, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = res.status === 204 ? null : await res.json().catch(() => null);
  if (!res.ok) {
    const err = new Error((data && (data.message || data.code)) || res.statusText);
    err.status = res.status;
    err.code = data && data.code;
    throw err;
  }
  return data;
}

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

async function signIn(t) {
  token = t;
  try {
    await api("GET", "/admin/v1/campaigns?limit=1");
  } catch (e) {
    token = "";
    sessionStorage.removeItem(tokenKey);
    showError(e.status === 403 || e.status === 401 ? "Sign-in refused: wrong admin token" : e);
    return;
  }
  sessionStorage.setItem(tokenKey, t);
  showError(null);
  $("who").textContent = "signed in as admin";
  $("signin").hidden = true;
  $("signout").hidden = false;
  $("console").hidden = false;
  await refresh();
}

function signOut() {
  stopWatching();
  token = "";
  sessionStorage.removeItem(tokenKey);
  $("who").textContent = "";
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("console").hidden = true;
}

async function refresh() {
  const { campaigns } = await api("GET", "/admin/v1/campaigns?limit=100");
  const body = $("campaigns").tBodies[0];
  body.replaceChildren(...campaigns.map(row));
}

function button(label, action, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = action;
  b.addEventListener("click", async () => {
    b.disabled = true;
    try { await onClick(); showError(null); } catch (e) { showError(e); }
    b.disabled = false;
    await refresh().catch(showError);
  });
  return b;
}

function row(c) {
  const tr = document.createElement("tr");
  tr.dataset.campaign = c.id;
  tr.dataset.state = c.state;
  for (const v of [c.id, c.name, c.state + (c.loaded ? "" : " (not loaded)"), c.stock]) {
    const td = document.createElement("td");
    td.textContent = v;
    tr.append(td);
  }
  const path = "/admin/v1/campaigns/" + encodeURIComponent(c.id);
  const td = document.createElement("td");
  td.append(
    button("Preload", "preload", () => api("POST", path + "/preload")),
    c.paused ? button("Resume", "resume", () => api("POST", path + "/resume"))
      : button("Pause", "pause", () => api("POST", path + "/pause")),
    button("End now", "end", () => confirmEnd(c.id) && api("POST", path + "/end")),
    button("Watch", "watch", () => watch(c.id)),
  );
  tr.append(td);
  return tr;
}

function confirmEnd(id) { return window.confirm("End " + id + " now? Queued requests are rejected."); }

async function create(form) {
  const f = new FormData(form);
  const body = {
    id: f.get("id"), name: f.get("name"),
    stock: Number(f.get("stock")), per_user_limit: Number(f.get("per_user_limit")), price: Number(f.get("price") || 0),
    payment_window: f.get("payment_window") || undefined,
    buckets: Number(f.get("buckets") || 1),
    start_at: new Date(f.get("start_at")).toISOString(), end_at: new Date(f.get("end_at")).toISOString(),
  };
  await api("POST", "/admin/v1/campaigns", body);
  showError(null);
  form.reset();
  defaultTimes();
  await refresh();
}

function defaultTimes() {
  const form = $("create");
  const now = Date.now();
  form.elements.start_at.value = new Date(now + 60_000).toISOString();
  form.elements.end_at.value = new Date(now + 3_600_000).toISOString();
}

function stopWatching() {
  if (watching) watching.abort.abort();
  watching = null;
}

// watch shows one campaign's stream, reopening it when it ends (the server
// closes each stream after a while, or restarts) until another is watched.
function watch(id) {
  stopWatching();
  const abort = new AbortController();
  watching = { id, abort };
  const series = { admitted: [], decided: [] };
  let prev = null;
  $("live").hidden = false;
  $("live-id").textContent = id;
  const onEvent = (type, data) => {
    if (type === "error") { $("live-conn").textContent = "stats unavailable (" + data.code + ")"; return; }
    $("live-conn").textContent = "live";
    const decided = Object.values(data.finished_by_status || {}).reduce((a, b) => a + b, 0);
    if (prev) {
      const secs = Math.max((Date.parse(data.at) - Date.parse(prev.at)) / 1000, 0.001);
      push(series.admitted, (data.admitted - prev.admitted) / secs);
      push(series.decided, (decided - prev.decided) / secs);
    }
    prev = { at: data.at, admitted: data.admitted, decided };
    $("remaining").textContent = data.remaining;
    $("admitted").textContent = data.admitted;
    $("queued").textContent = data.queued;
    $("decided").textContent = decided;
    for (const s of ["success", "sold_out", "limit_exceeded", "rejected"]) $("d-" + s).textContent = (data.finished_by_status || {})[s] || 0;
    $("orders").textContent = data.orders_in_db;
    draw("admitted", series.admitted);
    draw("decided", series.decided);
    window.flashsaleConsole.events++;
    window.flashsaleConsole.last = { ...data, decided };
  };
  (async () => {
    while (!abort.signal.aborted) {
      try {
        await stream(id, abort.signal, onEvent);
      } catch (e) {
        if (abort.signal.aborted) return;
        $("live-conn").textContent = "reconnecting (" + (e.message || e) + ")";
        if (e.status === 401 || e.status === 403) return signOut();
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
}

// stream reads one text/event-stream response, calling onEvent(type, data)
// per event, until the server ends it or signal aborts it.
async function stream(id, signal, onEvent) {
  const res = await fetch("/admin/v1/campaigns/" + encodeURIComponent(id) + "/stream", {
    headers: { Authorization: "Bearer " + token, Accept: "text/event-stream" }, signal,
  });
  if (!res.ok) {
    const data = await res.json().catch(() => ({}));
    const err = new Error(data.message || res.statusText);
    err.status = res.status;
    throw err;
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let type = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) type = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(type, JSON.parse(data));
    }
  }
}

function push(series, v) {
  series.push(v);
  if (series.length > chartPoints) series.shift();
}

// draw plots series as a polyline over the chart's 120×30 box, scaled to
// its largest value.
function draw(name, series) {
  const svg = $("chart-" + name);
  const top = Math.max(1, ...series);
  const step = 120 / (chartPoints - 1);
  const points = series.map((v, i) => `${((chartPoints - series.length + i) * step).toFixed(1)},${(30 - (v / top) * 28).toFixed(1)}`).join(" ");
  let line = svg.querySelector("polyline");
  if (!line) {
    line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    svg.append(line);
  }
  line.setAttribute("points", points);
  $("rate-" + name).textContent = series.length ? series[series.length - 1].toFixed(1) : "";
}

$("signin").addEventListener("submit", (e) => { e.preventDefault(); signIn($("token").value); });
$("signout").addEventListener("click", signOut);
$("create").addEventListener("submit", (e) => { e.preventDefault(); create(e.target).catch(showError); });
defaultTimes();
(async () => {
  if (token) await signIn(token);
  document.documentElement.dataset.ready = "true";
})();
