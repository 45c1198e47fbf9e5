// flashsale.js: the browser client of the flashsale API, a dependency-free
// ES module. docs/API.md ("The shopper page and the browser client") shows it in use.
//
//   const fs = createClient({ token });
//   const p = await fs.purchase("spring-sale", { quantity: 1 });
//   const r = await fs.waitForResult(p.requestId, { onProgress: (q) => … });
//
// One WebSocket carries every wait of a page; when it cannot be opened (or
// the notifier refuses a subscription) the waits poll instead, with backoff
// and jitter, honouring Retry-After. A dropped socket is reopened and its
// waits subscribed again: the notifier answers a subscription to a request
// already final with its result, so nothing is lost in between.

/** FlashsaleError is every refusal of the API: `code` is its stable error code. */
export class FlashsaleError extends Error {
  constructor(code, message, { status = 0, field, retryAfter, requestId } = {}) {
    super(message || code);
    this.name = new.target.name;
    this.code = code;
    this.status = status;
    this.field = field;
    this.retryAfter = retryAfter; // seconds, when the server said
    this.requestId = requestId;
  }
}
// One class per code of the OpenAPI document's ErrorCode enum, so callers
// can write `catch (e) { if (e instanceof SoldOutError) … }`.
export class InvalidRequestError extends FlashsaleError {}
export class UnauthorizedError extends FlashsaleError {}
export class ForbiddenError extends FlashsaleError {}
export class NotFoundError extends FlashsaleError {}
export class MethodNotAllowedError extends FlashsaleError {}
export class BodyTooLargeError extends FlashsaleError {}
export class UnsupportedMediaTypeError extends FlashsaleError {}
export class SaleStartedError extends FlashsaleError {}
export class NotStartedError extends FlashsaleError {}
export class EndedError extends FlashsaleError {}
export class NotLoadedError extends FlashsaleError {}
export class PausedError extends FlashsaleError {}
export class LimitExceededError extends FlashsaleError {}
export class ConflictError extends FlashsaleError {}
export class OrderNotPayableError extends FlashsaleError {}
export class OrderNotCancellableError extends FlashsaleError {}
export class OrderNotRefundableError extends FlashsaleError {}
export class AmountMismatchError extends FlashsaleError {}
export class PaymentConflictError extends FlashsaleError {}
export class BadSignatureError extends FlashsaleError {}
export class StaleSignatureError extends FlashsaleError {}
export class IdempotencyKeyReusedError extends FlashsaleError {}
export class SoldOutError extends FlashsaleError {}
export class RateLimitedError extends FlashsaleError {}
export class TooManySubscriptionsError extends FlashsaleError {}
export class TooManyConnectionsError extends FlashsaleError {}
export class UnavailableError extends FlashsaleError {}
export class InternalError extends FlashsaleError {}
export class ChallengeFailedError extends FlashsaleError {}
/** NetworkError: no answer at all (offline, refused, aborted). Its code is "network". */
export class NetworkError extends FlashsaleError {}

const errorClasses = {
  invalid_request: InvalidRequestError, unauthorized: UnauthorizedError, forbidden: ForbiddenError,
  not_found: NotFoundError, method_not_allowed: MethodNotAllowedError, body_too_large: BodyTooLargeError,
  unsupported_media_type: UnsupportedMediaTypeError, sale_started: SaleStartedError, not_started: NotStartedError,
  ended: EndedError, not_loaded: NotLoadedError, paused: PausedError, limit_exceeded: LimitExceededError,
  conflict: ConflictError, order_not_payable: OrderNotPayableError, order_not_cancellable: OrderNotCancellableError,
  order_not_refundable: OrderNotRefundableError, amount_mismatch: AmountMismatchError,
  payment_conflict: PaymentConflictError, bad_signature: BadSignatureError, stale_signature: StaleSignatureError,
  idempotency_key_reused: IdempotencyKeyReusedError, sold_out: SoldOutError, rate_limited: RateLimitedError,
  too_many_subscriptions: TooManySubscriptionsError, too_many_connections: TooManyConnectionsError,
  unavailable: UnavailableError, internal: InternalError, challenge_failed: ChallengeFailedError,
};

/** errorFor builds the typed error of an API code (FlashsaleError for a code this file does not know). */
export function errorFor(code, message, details) {
  const Class = errorClasses[code] || FlashsaleError;
  return new Class(code, message, details);
}

/** FINAL lists the statuses a purchase ends in; "queued" is the only other. */
export const FINAL = ["success", "sold_out", "limit_exceeded", "rejected"];

const defaults = {
  pollAfterSocketFailures: 2, // socket attempts in a row that never opened before the waits poll
  pollMinMs: 400,
  pollMaxMs: 5000,
  reconnectMinMs: 200,
  reconnectMaxMs: 15000,
  idleCloseMs: 15000, // a socket with nothing to wait for closes after this long
};

/** createClient returns a Client; see Client's constructor for the options. */
export function createClient(options = {}) {
  return new Client(options);
}

/**
 * Client talks to one flashsale deployment for one signed-in shopper.
 * Options: baseURL (default: the page's origin), token (the shopper's JWT),
 * wsURL (default: the purchase answer's ws_url; "off" never opens a socket),
 * storage (where Idempotency-Keys are kept across reloads; default
 * sessionStorage), fetch, WebSocket.
 */
export class Client {
  constructor({ baseURL = "", token = "", wsURL, storage, fetch: fetchFn, WebSocket: WS, ...tuning } = {}) {
    this.baseURL = baseURL.replace(/\/$/, "");
    this.token = token;
    this.wsURL = wsURL;
    this.opts = { ...defaults, ...tuning };
    this.storage = storage !== undefined ? storage : globalThis.sessionStorage;
    this.fetch = fetchFn || globalThis.fetch.bind(globalThis);
    this.WebSocket = WS || globalThis.WebSocket;
    this.keys = new Map();
    this.waits = new Map(); // request id → wait
    this.socket = null;
    this.socketOpen = false;
    this.socketFailures = 0;
    this.reconnectTimer = null;
    this.idleTimer = null;
    this.serverWSPath = "/api/v1/ws";
    /** stats counts what the client did: sockets opened, subscribe frames sent, polls sent. */
    this.stats = { socketsOpened: 0, subscribes: 0, polls: 0 };
  }

  /** setToken switches the shopper: the socket is the user's, so it is reopened. */
  setToken(token) {
    this.token = token;
    this.dropSocket();
    if (this.waits.size) this.openSocket();
  }

  /** close ends every wait (with a NetworkError) and the socket. */
  close() {
    for (const w of [...this.waits.values()]) this.settle(w, null, new NetworkError("network", "client closed"));
    this.dropSocket();
  }

  // ---- plain requests ----

  async request(method, path, { body, headers = {}, auth = true, signal } = {}) {
    const h = { ...headers };
    if (body !== undefined) h["Content-Type"] = "application/json";
    if (auth && this.token) h.Authorization = `Bearer ${this.token}`;
    let res;
    try {
      res = await this.fetch(this.baseURL + path, {
        method, headers: h, signal, body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new NetworkError("network", e && e.message ? e.message : String(e));
    }
    const text = await res.text().catch(() => "");
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { /* not JSON: an error below says so */ }
    if (!res.ok) {
      const retry = Number(res.headers.get("Retry-After"));
      throw errorFor((data && data.code) || (res.status >= 500 ? "unavailable" : "invalid_request"),
        (data && data.message) || `HTTP ${res.status}`,
        { status: res.status, field: data && data.field, retryAfter: Number.isFinite(retry) && retry > 0 ? retry : undefined });
    }
    return { status: res.status, data, headers: res.headers };
  }

  /** campaigns lists the sales not ended (no sign-in needed). */
  async campaigns() { return (await this.request("GET", "/api/v1/campaigns", { auth: false })).data.campaigns; }
  /** campaign is one public campaign. */
  async campaign(id) { return (await this.request("GET", `/api/v1/campaigns/${encodeURIComponent(id)}`, { auth: false })).data; }
  /** challenge fetches a campaign's proof-of-work puzzle (only once its sale started). */
  async challenge(id) { return (await this.request("GET", `/api/v1/campaigns/${encodeURIComponent(id)}/challenge`)).data; }
  /** order is one of the shopper's orders. */
  async order(id) { return (await this.request("GET", `/api/v1/orders/${encodeURIComponent(id)}`)).data; }
  /** pay starts (with the fake provider: completes) an order's payment. */
  async pay(id) { return (await this.request("POST", `/api/v1/orders/${encodeURIComponent(id)}/pay`)).data; }
  /** cancel cancels a pending order; its units go back on sale. */
  async cancel(id) { return (await this.request("POST", `/api/v1/orders/${encodeURIComponent(id)}/cancel`)).data; }

  /**
   * serverClock measures the server's clock against this one over a few
   * round trips and returns { offsetMs, now() }: now() is the server's
   * time in ms, for countdowns that must not trust the device's clock.
   */
  async serverClock(samples = 3) {
    let best = null;
    for (let i = 0; i < samples; i++) {
      const sent = performance.now();
      const { data } = await this.request("GET", "/api/v1/time", { auth: false });
      const rtt = performance.now() - sent;
      const offset = Date.parse(data.server_time) + rtt / 2 - Date.now();
      if (!best || rtt < best.rtt) best = { rtt, offset };
    }
    const offsetMs = best.offset;
    return { offsetMs, rttMs: best.rtt, now: () => Date.now() + offsetMs };
  }

  // ---- purchase ----

  /** keyFor is the Idempotency-Key of the shopper's purchase of quantity in a campaign, made once and kept. */
  keyFor(campaignId, quantity) {
    const name = `flashsale:key:${campaignId}:${quantity}`;
    let key = this.keys.get(name);
    if (!key && this.storage) { try { key = this.storage.getItem(name); } catch { /* storage may be blocked */ } }
    if (!key) {
      key = randomKey();
      if (this.storage) { try { this.storage.setItem(name, key); } catch { /* kept in memory only */ } }
    }
    this.keys.set(name, key);
    return key;
  }

  /** forgetKey drops the kept keys of a campaign: the next purchase there is a new one. */
  forgetKey(campaignId) {
    const prefix = `flashsale:key:${campaignId}:`;
    for (const name of [...this.keys.keys()]) if (name.startsWith(prefix)) this.keys.delete(name);
    if (this.storage) {
      try {
        for (let i = this.storage.length - 1; i >= 0; i--) {
          const name = this.storage.key(i);
          if (name && name.startsWith(prefix)) this.storage.removeItem(name);
        }
      } catch { /* nothing kept there */ }
    }
  }

  /**
   * purchase asks for quantity units and returns the request as the server
   * answered: { requestId, status, orderId?, reason?, replay, idempotencyKey }.
   * The Idempotency-Key is kept per campaign and quantity, so a click
   * retried (here after a network error, or by the shopper) names the same
   * request and never buys twice. challenge is the solved
   * "<challenge>.<nonce>" when the campaign asks for one. Refusals throw
   * the typed errors above.
   */
  async purchase(campaignId, { quantity = 1, idempotencyKey, challenge, retries = 2 } = {}) {
    const key = idempotencyKey || this.keyFor(campaignId, quantity);
    const headers = { "Idempotency-Key": key };
    if (challenge) headers["Flashsale-Challenge"] = challenge;
    for (let attempt = 0; ; attempt++) {
      try {
        const { status, data } = await this.request("POST", `/api/v1/campaigns/${encodeURIComponent(campaignId)}/purchases`,
          { body: { quantity }, headers });
        if (data.ws_url) this.serverWSPath = data.ws_url;
        return { requestId: data.request_id, status: data.status, orderId: data.order_id, reason: data.reason,
          replay: status === 200, idempotencyKey: key };
      } catch (e) {
        // Only an answer lost on the way is retried: the same key makes
        // the retry a replay if the first one arrived.
        if (!(e instanceof NetworkError) || attempt >= retries) throw e;
        await sleep(jitter(300 * 2 ** attempt));
      }
    }
  }

  /**
   * waitForResult resolves with the final result of a purchase: {requestId,
   * campaignId, status, quantity, orderId?, reason?, via: "websocket"|"poll"}.
   * onProgress({ahead, etaMs}) is called while it is queued, when the
   * server tells its position. signal (an AbortSignal) stops waiting.
   */
  waitForResult(requestId, { onProgress, signal } = {}) {
    const existing = this.waits.get(requestId);
    if (existing) {
      if (onProgress) existing.listeners.push(onProgress);
      return existing.promise;
    }
    const w = { id: requestId, listeners: onProgress ? [onProgress] : [], subscribed: false, polling: false, done: false };
    w.promise = new Promise((resolve, reject) => { w.resolve = resolve; w.reject = reject; });
    this.waits.set(requestId, w);
    clearTimeout(this.idleTimer);
    if (signal) {
      if (signal.aborted) this.settle(w, null, new NetworkError("network", "aborted"));
      signal.addEventListener("abort", () => this.settle(w, null, new NetworkError("network", "aborted")), { once: true });
    }
    if (this.socketDisabled() || this.socketFailures >= this.opts.pollAfterSocketFailures) this.poll(w);
    if (!this.socketDisabled()) {
      if (this.socketOpen) this.subscribe([requestId]);
      else this.openSocket();
    }
    return w.promise;
  }

  settle(w, result, err) {
    if (w.done) return;
    w.done = true;
    this.waits.delete(w.id);
    if (err) w.reject(err); else w.resolve(result);
    // A crowd that got its results should not keep its sockets: the next
    // wait opens one again.
    if (!this.waits.size) {
      clearTimeout(this.idleTimer);
      this.idleTimer = setTimeout(() => { if (!this.waits.size) this.dropSocket(); }, this.opts.idleCloseMs);
    }
  }

  progress(w, ahead, etaMs) {
    if (typeof ahead !== "number") return;
    for (const f of w.listeners) { try { f({ ahead, etaMs }); } catch (e) { console.error(e); } }
  }

  // ---- the WebSocket ----

  socketDisabled() { return this.wsURL === "off" || !this.WebSocket; }

  socketURL() {
    const base = this.baseURL || globalThis.location.origin;
    const u = new URL(this.wsURL || this.serverWSPath, base + "/");
    if (u.protocol === "http:") u.protocol = "ws:";
    if (u.protocol === "https:") u.protocol = "wss:";
    // A browser cannot set headers on a WebSocket: the token goes in the query.
    u.searchParams.set("access_token", this.token);
    return u.toString();
  }

  openSocket() {
    if (this.socket || this.reconnectTimer || this.socketDisabled()) return;
    let ws;
    try {
      ws = new this.WebSocket(this.socketURL());
    } catch {
      this.socketClosed(false);
      return;
    }
    this.socket = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.socketOpen = true;
      this.socketFailures = 0;
      this.stats.socketsOpened++;
      this.subscribe([...this.waits.keys()]);
    };
    ws.onmessage = (ev) => this.onFrame(ev.data);
    ws.onclose = () => { if (this.socket === ws) this.socketClosed(opened); };
    ws.onerror = () => { /* onclose follows */ };
  }

  socketClosed(opened) {
    this.socket = null;
    this.socketOpen = false;
    for (const w of this.waits.values()) w.subscribed = false;
    if (!opened) this.socketFailures++;
    if (!this.waits.size) return;
    if (this.socketFailures >= this.opts.pollAfterSocketFailures) for (const w of this.waits.values()) this.poll(w);
    // A socket that was open reconnects at once (with a little jitter, so
    // a notifier's restart is not met by every page in the same ms); one
    // that never opened backs off.
    const delay = opened ? jitter(this.opts.reconnectMinMs)
      : jitter(Math.min(this.opts.reconnectMaxMs, this.opts.reconnectMinMs * 2 ** this.socketFailures));
    this.reconnectTimer = setTimeout(() => { this.reconnectTimer = null; if (this.waits.size) this.openSocket(); }, delay);
  }

  dropSocket() {
    clearTimeout(this.idleTimer);
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    const ws = this.socket;
    this.socket = null;
    this.socketOpen = false;
    this.socketFailures = 0;
    for (const w of this.waits.values()) w.subscribed = false;
    if (ws) { ws.onclose = null; ws.close(); }
  }

  subscribe(ids) {
    if (!ids.length || !this.socketOpen) return;
    this.stats.subscribes++;
    this.socket.send(JSON.stringify({ type: "subscribe", request_ids: ids }));
  }

  onFrame(raw) {
    let m;
    try { m = JSON.parse(raw); } catch { return; }
    const w = m.request_id ? this.waits.get(m.request_id) : undefined;
    switch (m.type) {
      case "subscribed":
        for (const id of m.request_ids || []) { const s = this.waits.get(id); if (s) s.subscribed = true; }
        break;
      case "result": {
        const r = m.result || {};
        const s = this.waits.get(r.request_id);
        if (s && FINAL.includes(r.status)) this.settle(s, resultOf(r, "websocket"));
        break;
      }
      case "progress":
        if (w) this.progress(w, m.ahead, m.eta_ms);
        break;
      case "error":
        if (!w) break;
        if (m.code === "not_found") this.settle(w, null, errorFor(m.code, m.message, { requestId: m.request_id }));
        // The notifier cannot take this one now: the poll endpoint can.
        else this.poll(w, m.retry_after);
        break;
    }
  }

  // ---- polling ----

  async poll(w, retryAfter) {
    if (w.polling || w.done) return;
    w.polling = true;
    let delay = this.opts.pollMinMs;
    let notBefore = (retryAfter || 0) * 1000; // the server's Retry-After, never shortened by jitter
    if (notBefore) await sleep(notBefore);
    while (!w.done) {
      notBefore = 0;
      // The socket took the wait over.
      if (w.subscribed && this.socketOpen) break;
      try {
        this.stats.polls++;
        const { data } = await this.request("GET", `/api/v1/purchases/${encodeURIComponent(w.id)}`);
        if (FINAL.includes(data.status)) { this.settle(w, resultOf(data, "poll")); break; }
        this.progress(w, data.ahead, data.eta_ms);
        delay = Math.min(this.opts.pollMaxMs, delay * 1.5);
      } catch (e) {
        if (e instanceof RateLimitedError || e instanceof UnavailableError) {
          delay = Math.min(this.opts.pollMaxMs, delay * 2);
          notBefore = (e.retryAfter || 0) * 1000;
        } else if (e instanceof NetworkError || e instanceof InternalError) {
          delay = Math.min(this.opts.pollMaxMs, delay * 2);
        } else {
          this.settle(w, null, e); // not_found, unauthorized: waiting longer will not help
          break;
        }
      }
      await sleep(Math.max(notBefore, jitter(delay)));
    }
    w.polling = false;
  }
}

// resultOf is a result as this module hands it out (the fields of
// purchase's answer, named alike).
function resultOf(r, via) {
  return { requestId: r.request_id, campaignId: r.campaign_id, status: r.status, quantity: r.quantity,
    orderId: r.order_id, reason: r.reason, via };
}

// jitter spreads a delay over [d/2, d], so that pages told to wait the
// same time do not come back in the same ms.
function jitter(ms) { return ms / 2 + Math.random() * ms / 2; }

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

function randomKey() {
  if (globalThis.crypto && crypto.randomUUID) return crypto.randomUUID();
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}
