// app.js: the shopper page. Every API call goes through flashsale.js, the
// client a shop's own frontend would use.
//
// Query parameters: ?ws=URL sends the page's WebSocket there instead of the
// server's ws_url ("off": no socket, the page polls); for trying the
// fallback and for the browser tests.
import * as flashsale from "./flashsale.js";
import { solve } from "./pow.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const tokenKey = "flashsale:token";

const client = flashsale.createClient({ token: localStorage.getItem(tokenKey) || "", wsURL: params.get("ws") || undefined });
window.flashsaleClient = client; // for the console and the browser tests

let clock = { now: () => Date.now() }; // until the server's is measured
let view = null; // the open campaign view's state

// ---- sign-in ----

function subjectOf(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(decodeURIComponent(escape(atob(part)))).sub || "";
  } catch {
    return "";
  }
}

function signIn(token) {
  token = token.trim();
  if (token) localStorage.setItem(tokenKey, token); else localStorage.removeItem(tokenKey);
  client.setToken(token);
  showWho();
}

function showWho() {
  const sub = client.token ? subjectOf(client.token) : "";
  $("who").textContent = client.token ? `signed in as ${sub || "?"}` : "not signed in";
  $("token").value = client.token;
  $("signin-box").open = !client.token;
}

$("signin").addEventListener("submit", (e) => {
  e.preventDefault();
  signIn($("token").value);
  $("signin-msg").textContent = client.token ? "Token saved in this browser." : "";
});
$("signout").addEventListener("click", () => { signIn(""); $("signin-msg").textContent = "Signed out."; });
$("dev-signin").addEventListener("submit", async (e) => {
  e.preventDefault();
  try {
    const user = encodeURIComponent($("dev-user").value.trim() || "alice");
    const { data } = await client.request("GET", `/api/v1/dev/token?user=${user}`, { auth: false });
    signIn(data.token);
    $("signin-msg").textContent = `Development token for ${data.user_id}.`;
  } catch (err) {
    $("signin-msg").textContent = err instanceof flashsale.NotFoundError
      ? "This server mints no tokens: development mode (the embedded default) only."
      : `Could not get a token: ${err.message}`;
  }
});

// ---- formatting ----

function money(minor) { return (minor / 100).toFixed(2); }

function duration(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60, sec = s % 60;
  const hms = `${String(h).padStart(2, "0")}:${String(m).padStart(2, "0")}:${String(sec).padStart(2, "0")}`;
  return d ? `${d}d ${hms}` : hms;
}

function stateOf(c) {
  if (c.sold_out) return "sold_out";
  if (c.state === "upcoming" && clock.now() >= Date.parse(c.start_at)) return "running";
  return c.state;
}

const stateLabel = { upcoming: "upcoming", running: "on sale", paused: "paused", ended: "ended", sold_out: "sold out" };

// ---- the list ----

let listTimer = null;

async function showList() {
  $("list-view").hidden = false;
  $("campaign-view").hidden = true;
  clearInterval(listTimer);
  const render = async () => {
    try {
      const campaigns = await client.campaigns();
      const ul = $("campaigns");
      ul.replaceChildren(...campaigns.map((c) => {
        const li = document.createElement("li");
        const a = document.createElement("a");
        a.href = `#/campaigns/${encodeURIComponent(c.id)}`;
        a.dataset.campaign = c.id;
        const st = stateOf(c);
        const when = st === "upcoming" ? `starts in ${duration(Date.parse(c.start_at) - clock.now())}` : `ends in ${duration(Date.parse(c.end_at) - clock.now())}`;
        a.innerHTML = `<span class="name"></span><span class="badge ${st}">${stateLabel[st] || st}</span><br><span class="muted"></span>`;
        a.querySelector(".name").textContent = c.name;
        a.querySelector(".muted").textContent = `${money(c.price)} · ${when}`;
        li.append(a);
        return li;
      }));
      $("list-msg").textContent = campaigns.length ? "" : "No sales right now.";
    } catch (err) {
      $("list-msg").textContent = `Could not load the sales: ${err.message}`;
    }
  };
  await render();
  listTimer = setInterval(() => { if (!$("list-view").hidden) render(); }, 5000);
}

// ---- one campaign ----

function setStatus(state, text, via) {
  const el = $("status");
  el.dataset.state = state;
  el.dataset.via = via || "";
  el.textContent = text;
}

async function showCampaign(id) {
  clearInterval(listTimer);
  if (view) view.stop();
  $("list-view").hidden = true;
  $("campaign-view").hidden = false;
  $("order").hidden = true;
  setStatus("", "");
  $("c-name").textContent = "…";
  let c;
  try {
    c = await client.campaign(id);
  } catch (err) {
    $("c-name").textContent = "Sale not found";
    setStatus("error", err.message);
    return;
  }
  const v = { c, busy: false, done: false, timers: [] };
  v.stop = () => v.timers.forEach((t) => { clearInterval(t); clearTimeout(t); });
  view = v;
  $("c-name").textContent = c.name;
  const q = $("quantity");
  q.max = String(c.per_user_limit);
  q.value = "1";
  const meta = () => `${money(c.price)} each · up to ${c.per_user_limit} per shopper` +
    (c.remaining !== undefined ? ` · ${c.remaining} left` : "");
  $("c-meta").textContent = meta();
  if (c.sold_out) setStatus("sold_out", "Sold out");

  const start = Date.parse(c.start_at), end = Date.parse(c.end_at);
  const tick = () => {
    const now = clock.now();
    const open = now >= start && now < end && c.state !== "ended";
    if (now < start) $("countdown").textContent = `Starts in ${duration(start - now)}`;
    else if (open) $("countdown").textContent = `On sale · ends in ${duration(end - now)}`;
    else $("countdown").textContent = "The sale has ended";
    $("buy").disabled = !open || v.busy || v.done || c.sold_out || !client.token;
    $("buy").textContent = client.token ? "Buy" : "Sign in to buy";
  };
  tick();
  v.timers.push(setInterval(tick, 250));
  // The button opens at the start to the ms, not at the next tick.
  if (start > clock.now()) v.timers.push(setTimeout(tick, start - clock.now()));
  // The campaign's own state moves too (sold out, units returned, paused).
  v.timers.push(setInterval(async () => {
    try {
      const fresh = await client.campaign(id);
      const wasSoldOut = c.sold_out;
      Object.assign(c, fresh);
      $("c-meta").textContent = meta();
      if (!v.busy && !v.done && c.sold_out && !wasSoldOut) setStatus("sold_out", "Sold out");
      if (!v.busy && !v.done && !c.sold_out && wasSoldOut) setStatus("", "Units are back on sale.");
    } catch { /* keep what is shown */ }
  }, 3000));
  v.tick = tick;
}

$("buy-form").addEventListener("submit", (e) => { e.preventDefault(); buy(); });
// The quantity stays within 1..per_user_limit as it is typed (the form does
// not block on it: buy() clamps what is left).
$("quantity").addEventListener("change", () => { if (view) $("quantity").value = String(quantityOf(view.c)); });

function quantityOf(c) { return Math.max(1, Math.min(c.per_user_limit, Math.floor(Number($("quantity").value)) || 1)); }

async function buy() {
  const v = view;
  if (!v || v.busy) return;
  const c = v.c;
  const quantity = quantityOf(c);
  $("quantity").value = String(quantity);
  v.busy = true;
  v.tick();
  try {
    let challenge;
    if (c.challenge_bits > 0) {
      setStatus("solving", "Checking you are not a bot…");
      challenge = await solveChallenge(c.id);
    }
    setStatus("sending", "Sending…");
    const p = await client.purchase(c.id, { quantity, challenge });
    let r = { ...p, via: "replay" };
    if (!flashsale.FINAL.includes(p.status)) {
      setStatus("queued", "Queued: waiting for your turn…");
      r = await client.waitForResult(p.requestId, {
        onProgress: ({ ahead, etaMs }) => {
          const eta = typeof etaMs === "number" ? `, about ${Math.ceil(etaMs / 1000)} s` : "";
          setStatus("queued", ahead > 0 ? `Queued: ${ahead} ahead of you${eta}` : "Queued: you are next");
        },
      });
    }
    showResult(v, r);
  } catch (err) {
    showRefusal(v, err);
  } finally {
    v.busy = false;
    v.tick();
  }
}

function showResult(v, r) {
  switch (r.status) {
    case "success":
      v.done = true;
      setStatus("success", "You got it!", r.via);
      showOrder(v, r.orderId);
      break;
    case "sold_out":
      v.done = true;
      setStatus("sold_out", "Sold out", r.via);
      break;
    case "limit_exceeded":
      v.done = true;
      setStatus("refused", "You already bought as many as a shopper may.", r.via);
      break;
    default:
      setStatus("refused", `Not sold (${r.reason || r.status}).`, r.via);
      client.forgetKey(v.c.id); // that request is over: another click is another try
  }
}

function showRefusal(v, err) {
  const F = flashsale;
  if (err instanceof F.SoldOutError) { v.done = true; setStatus("sold_out", "Sold out"); return; }
  const text =
    err instanceof F.NotStartedError ? "The sale has not started yet." :
    err instanceof F.EndedError ? "The sale has ended." :
    err instanceof F.PausedError ? "The sale is paused; try again in a moment." :
    err instanceof F.NotLoadedError ? "The sale is not open yet." :
    err instanceof F.LimitExceededError ? "You already bought as many as a shopper may." :
    err instanceof F.RateLimitedError ? `Too many tries; wait ${err.retryAfter || 1} s.` :
    err instanceof F.UnauthorizedError ? "Sign in again: your token was refused." :
    err instanceof F.ChallengeFailedError ? "The bot check failed; try again." :
    err instanceof F.NetworkError ? "No connection. Try again: the same click never buys twice." :
    err instanceof F.UnavailableError ? "The shop is busy; try again: the same click never buys twice." :
    `Refused: ${err.message}`;
  setStatus("refused", text);
  if (err instanceof F.EndedError) v.done = true;
}

// solveChallenge fetches the campaign's puzzle and solves it (pow.js runs
// the search in Web Workers, so the page stays responsive); it answers
// "<challenge>.<nonce>".
async function solveChallenge(id) {
  const { challenge, bits } = await client.challenge(id);
  return `${challenge}.${await solve(challenge, bits)}`;
}

// ---- the order after a success ----

async function showOrder(v, orderId) {
  $("order").hidden = false;
  $("order-info").textContent = "Loading your order…";
  let o;
  // The order row lands a moment after the result is final.
  for (let i = 0; i < 20 && !o; i++) {
    try { o = await client.order(orderId); } catch (err) {
      if (!(err instanceof flashsale.NotFoundError)) { $("order-info").textContent = err.message; return; }
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  if (!o) { $("order-info").textContent = `Order ${orderId}`; return; }
  renderOrder(v, o);
}

function renderOrder(v, o) {
  $("order").dataset.status = o.status;
  $("order-info").textContent = `${o.quantity} × ${v.c.name} · ${money(o.amount)} · ${o.status.replace("_", " ")}`;
  const pending = o.status === "pending_payment";
  $("pay").hidden = $("cancel").hidden = !pending;
  clearInterval(v.orderTimer);
  $("order-left").textContent = "";
  if (pending && o.expires_at) {
    const until = Date.parse(o.expires_at);
    const left = () => {
      const ms = until - clock.now();
      $("order-left").textContent = ms > 0 ? `Pay within ${duration(ms)}` : "The payment window has passed.";
      if (ms <= 0) { $("pay").disabled = true; clearInterval(v.orderTimer); }
    };
    left();
    v.orderTimer = setInterval(left, 500);
    v.timers.push(v.orderTimer);
  }
  $("pay").disabled = $("cancel").disabled = false;
  $("pay").onclick = () => orderAction(v, o, () => client.pay(o.id), "paid", "Paid. Thank you!");
  $("cancel").onclick = () => orderAction(v, o, () => client.cancel(o.id), "cancelled", "Cancelled: the units are back on sale.");
}

async function orderAction(v, o, act, state, text) {
  $("pay").disabled = $("cancel").disabled = true;
  try {
    await act();
    setStatus(state, text);
    if (state === "cancelled") client.forgetKey(v.c.id);
    renderOrder(v, await client.order(o.id));
  } catch (err) {
    setStatus("refused", err instanceof flashsale.OrderNotPayableError ? "This order can no longer be paid." :
      err instanceof flashsale.OrderNotCancellableError ? "This order can no longer be cancelled." : err.message);
    renderOrder(v, await client.order(o.id).catch(() => o));
  }
}

// ---- routing ----

function route() {
  const m = location.hash.match(/^#\/campaigns\/(.+)$/);
  if (m) showCampaign(decodeURIComponent(m[1]));
  else { if (view) view.stop(); view = null; showList(); }
}

window.addEventListener("hashchange", route);
showWho();
try {
  clock = await client.serverClock();
} catch { /* the device's clock, then */ }
window.flashsaleClock = clock;
document.documentElement.dataset.clockOffsetMs = String(Math.round(clock.offsetMs || 0));
route();
document.documentElement.dataset.ready = "true";
