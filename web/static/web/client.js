// @ts-check
// The Relay browser client: one user's connection, kept up across instance deaths, restarts and
// drops. An ES module with no dependency and no build step; the demo page (demo.js) uses it, and
// so may any page. The rules it follows are the Python client's (docs/clients.md):
//
// - Reconnect with jittered exponential back-off after any close but a refusal (4401, 4429);
//   after a refusal only if the token function gives a token other than the one refused.
// - Per channel, deliver only the next seq and hold a later one. A held seq is a gap: wait
//   `gapWaitMs` for the live frame that is merely late (two instances publish independently),
//   then read the missing ones from the history endpoint with the connection token.
// - Resume with the cursor of the highest contiguous seq delivered per channel, never the highest
//   seen: what was held is sent again by the resume, and what was missing comes with it.
// - A send stays pending until acknowledged and goes again, with the same idem_key, on every new
//   connection: the server answers a repeated idem_key with the first one's ack, so it lands once.
// - Rich presence: a status is the server's to keep, so `setStatus` goes again only while
//   unanswered; idle belongs to a connection, so a page that said idle says it again on every new
//   connection (each starts active).

/** @typedef {{connection_id: string, user: string, channels: string[]}} ConnectionAck */
/** @typedef {{status: string, text: string, emoji: string, until: string | null, idle: boolean}} Status */
/** @typedef {{online: string[], status?: Record<string, Status>, occupancy?: Record<string, number>}} PresenceSnapshot */
/** @typedef {Status & {user: string, invisible?: boolean}} PresenceStatus */
/**
 * @typedef {object} PresenceRequest a presence.set or presence.query waiting for its answer
 * @property {string} type
 * @property {object} payload
 * @property {(answer: any) => void} resolve
 * @property {(error: Error) => void} reject
 * @property {number | null} sent the connection serial it was last sent on
 */
/** @typedef {{user: string, state: "online" | "offline"}} PresenceChanged */
/**
 * @typedef {{channel: string, online: number | null}} PresenceOccupancy how many members of a large
 * channel are online; null: a new connection's snapshot no longer counts the channel (it became
 * small, or the user left it), and its people come as "presence" events
 */
/** @typedef {{idem_key: string, id: string, channel: string, seq: number}} MessageAck */
/** @typedef {{id: string, channel: string, seq: number, user: string, text: string, created_at: string}} MessageCreated */
/** @typedef {{channel: string, user: string, name: string, data: Record<string, unknown>}} Signal */
/** @typedef {{code: string, message: string, type?: string, retry_after_ms?: number}} ErrorPayload */
/** @typedef {string | (() => string | Promise<string>)} TokenSource */
/**
 * @typedef {object} SendRequest
 * @property {{idem_key: string, channel: string, text: string}} payload
 * @property {Promise<MessageAck>} promise
 * @property {(ack: MessageAck) => void} resolve
 * @property {(error: Error) => void} reject
 * @property {[number, number] | null} sent (connection serial, order) of its last transmission
 */

/**
 * The events a RelayClient dispatches (each a CustomEvent whose `detail` is shown):
 * - "presence": PresenceChanged. After a reconnect, the differences from the new snapshot come as these.
 * - "status": PresenceStatus, a co-member's (or the user's own, with `invisible`) status changed.
 * - "occupancy": PresenceOccupancy, the count of a large channel's online members changed (its people
 *   are counted, not named: docs/contract.md, Large rooms). After a reconnect, the differences from
 *   the new snapshot come as these. `online: null`: the channel is counted no more (it became small,
 *   or the user left it).
 * - "message": MessageCreated, each once and in seq order per channel.
 * - "signal": Signal, another member's signal (e.g. "typing") in one of the user's channels; never stored.
 * - "relay-error": ErrorPayload, an `error` frame that answered no send (a refused signal among them).
 * - "connected": ConnectionAck, the first connection (`connect()` resolves after its snapshot).
 * - "disconnected": {code: number, retryInMs: number}; `online` is the last view until "reconnected".
 * - "reconnected": ConnectionAck.
 * - "stopped": {code: number}: refused (4401, 4429) with no new token; the client will not reconnect.
 * @typedef {"presence" | "status" | "occupancy" | "message" | "signal" | "relay-error" | "connected" | "disconnected" | "reconnected" | "stopped"} RelayEventType
 */

// Past this many characters of cursor the URL would near the server's 16 KB request head: the
// cursor goes as the connection's first frame instead (`resume=frame`).
const MAX_URL_CURSOR_CHARS = 4096;
export const CLOSE_UNAUTHORIZED = 4401;
export const CLOSE_TOO_MANY = 4429;
const REFUSALS = new Set([CLOSE_UNAUTHORIZED, CLOSE_TOO_MANY]);
// The contract's bounds on `text`: a frame over 1 MiB is answered with a close (1009), and a
// pending send that goes again after every reconnect would loop on it.
export const MAX_TEXT_LENGTH = 16_384;
export const MAX_SIGNAL_NAME_LENGTH = 32;
export const MAX_SIGNAL_DATA_BYTES = 256;
const HISTORY_PAGE = 500; // the endpoint's largest page

// The JSON shape of each server frame this client acts on; one that does not fit is ignored whole.
/** @type {Record<string, Record<string, string>>} */
const SHAPES = {
  "connection.ack": { connection_id: "string", user: "string", channels: "string[]" },
  "presence.snapshot": { online: "string[]", status: "object?", occupancy: "counts?" },
  "presence.status": { user: "string", status: "string", text: "string", emoji: "string", until: "string|null", idle: "bool" },
  "presence.result": { users: "object" },
  "presence.changed": { user: "string", state: "state" },
  "presence.occupancy": { channel: "string", online: "count", large: "bool?" },
  "message.ack": { idem_key: "string", id: "string", channel: "string", seq: "seq" },
  "message.created": { id: "string", channel: "string", seq: "seq", user: "string", text: "string", created_at: "string" },
  signal: { channel: "string", user: "string", name: "string", data: "object" },
  error: { code: "string", message: "string", type: "string?" },
};

/** @type {Record<string, (value: unknown) => boolean>} */
const FITS = {
  string: (value) => typeof value === "string",
  "string?": (value) => value === undefined || typeof value === "string",
  "string[]": (value) => Array.isArray(value) && value.every((item) => typeof item === "string"),
  seq: (value) => Number.isSafeInteger(value),
  count: isCount,
  "counts?": (value) => value === undefined || (isObject(value) && Object.values(value).every(isCount)),
  state: (value) => value === "online" || value === "offline",
  "string|null": (value) => value === null || typeof value === "string",
  bool: (value) => typeof value === "boolean",
  "bool?": (value) => value === undefined || typeof value === "boolean",
  "object?": (value) => value === undefined || isObject(value),
  object: isObject,
};

/** @param {unknown} value */
function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** @param {unknown} value */
function isCount(value) {
  return Number.isSafeInteger(value) && /** @type {number} */ (value) >= 0;
}

export const DEVICES = ["web", "mobile", "desktop", "bot"];

/**
 * The frame a text holds, or null for one this client cannot use (never a reason to drop the connection).
 * @param {unknown} data
 * @returns {{type: string, payload: any} | null}
 */
export function parseFrame(data) {
  if (typeof data !== "string") return null;
  let frame;
  try {
    frame = JSON.parse(data);
  } catch {
    return null;
  }
  return frame && typeof frame === "object" && fits(frame.type, frame.payload) ? frame : null;
}

/**
 * Whether `payload` is a well-formed payload of the server frame `type` (extra fields are allowed).
 * @param {unknown} type
 * @param {any} payload
 */
function fits(type, payload) {
  const shape = typeof type === "string" ? SHAPES[type] : undefined;
  if (!shape || !payload || typeof payload !== "object" || Array.isArray(payload)) return false;
  return Object.entries(shape).every(([field, kind]) => FITS[kind](payload[field]));
}

/** The instance's WebSocket base for a page it served: ws(s)://host. */
export function sameOriginUrl() {
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}`;
}

export class RelayClient extends EventTarget {
  #url;
  #httpUrl;
  /** @type {TokenSource} */
  #tokenSource;
  #token = "";
  #gapWaitMs;
  #openTimeoutMs;
  #retryBaseMs;
  #retryCapMs;
  #device;
  #stableAfterMs;

  /** @type {string | null} */
  #user = null;
  /** @type {Map<string, Status>} user -> status, for the online co-members */
  #statuses = new Map();
  /** @type {PresenceStatus | null} the user's own, as the server last told it */
  #own = null;
  #idle = false;
  /** @type {PresenceRequest[]} presence.set and presence.query in the order they were asked */
  #presenceRequests = [];
  /** @type {Set<string>} */
  #online = new Set();
  /** @type {Map<string, number>} large channel -> how many of its members are online */
  #occupancy = new Map();
  /** @type {Map<string, number>} channel -> highest contiguous seq delivered */
  #positions;
  /** @type {Map<string, Map<number, MessageCreated>>} channel -> seqs held behind a gap */
  #held = new Map();
  /** @type {Map<string, number>} channel -> the connection serial its running fill belongs to */
  #fills = new Map();
  /** @type {Map<string, SendRequest>} channel and idem_key -> a send not yet answered */
  #pending = new Map();

  /** @type {WebSocket | null} */
  #socket = null;
  #serial = 0; // counts connections; work started for one checks it is still current
  #order = 0;
  #live = false;
  #started = false;
  #stopped = false;
  #failures = 0;
  #retrying = false; // sends refused `rate_limited` are to go again
  /** @type {{code: number, token: string} | null} */
  #refused = null;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #retryTimer;
  /** @type {{resolve: () => void, reject: (error: Error) => void} | null} */
  #ready = null;

  /**
   * @param {object} options
   * @param {TokenSource} options.token a token, or a function (maybe async) called for a fresh one before every connection
   * @param {string} [options.url] the instance's base, ws(s)://host[:port]; the page's own origin by default
   * @param {Record<string, number>} [options.cursor] {channel: last seq the page has}; default: each channel's whole history first
   * @param {number} [options.gapWaitMs] how long a skipped seq may be merely late before the history is read
   * @param {number} [options.openTimeoutMs] how long connection.ack and presence.snapshot may take
   * @param {number} [options.retryBaseMs] the reconnect back-off's first step
   * @param {number} [options.retryCapMs] and its ceiling
   * @param {string} [options.device] this connection's kind for presence: web, mobile, desktop or bot
   * @param {number} [options.stableAfterMs] how long a connection must stay up before the back-off starts again
   *   from its first step (a server that acknowledges and then closes at once is retried ever more slowly)
   */
  constructor({
    token,
    url = sameOriginUrl(),
    cursor = {},
    gapWaitMs = 500,
    openTimeoutMs = 10_000,
    retryBaseMs = 500,
    retryCapMs = 30_000,
    device = "web",
    stableAfterMs = 30_000,
  }) {
    super();
    if (!DEVICES.includes(device)) throw new RangeError(`device is one of ${DEVICES.join(", ")}`);
    this.#device = device;
    this.#url = url.replace(/\/+$/, "");
    this.#httpUrl = this.#url.replace(/^ws/, "http");
    this.#tokenSource = token;
    this.#positions = new Map(Object.entries(cursor));
    this.#gapWaitMs = gapWaitMs;
    this.#openTimeoutMs = openTimeoutMs;
    this.#retryBaseMs = retryBaseMs;
    this.#retryCapMs = retryCapMs;
    this.#stableAfterMs = stableAfterMs;
  }

  /** The user ids online among the user's co-members: the snapshot, then every change. */
  get online() {
    return new Set(this.#online);
  }

  /**
   * How many members are online in each of the user's large channels (channel id -> count): the
   * snapshot, then every `presence.occupancy`. A channel here is counted, not named: its people
   * are in `online` only when they share another, small channel with the user.
   */
  get occupancy() {
    return new Map(this.#occupancy);
  }

  /** Each online co-member's status (and the user's): {status, text, emoji, until, idle}. */
  get statuses() {
    return Object.fromEntries(this.#statuses);
  }

  /** The user's own status as the server last told it, with `invisible`; null until it has. */
  get ownStatus() {
    return this.#own;
  }

  /** Whether the user is invisible, as the server last told this client. */
  get invisible() {
    return !!this.#own?.invisible;
  }

  /** Whether this page told the server its connection is idle. */
  get idle() {
    return this.#idle;
  }

  /**
   * Set any of status, text, emoji, until (ISO-8601 or null) and invisible; resolves with the
   * user's status as the server answers it (with `invisible`), rejects with the server's refusal
   * (`forbidden`, `rate_limited`, `invalid_frame`) as an Error carrying `code`.
   * @param {{status?: string, text?: string, emoji?: string, until?: string | null, invisible?: boolean}} fields
   * @returns {Promise<PresenceStatus>}
   */
  setStatus(fields) {
    return this.#presenceRequest("presence.set", fields);
  }

  /**
   * Tell the server this connection is idle (or active again); said again after a reconnect.
   * @param {boolean} idle
   */
  setIdle(idle) {
    this.#idle = idle;
    if (this.#live) this.#socket?.send(JSON.stringify({ type: "presence.activity", payload: { idle } }));
  }

  /**
   * State, last seen and status of users (1-100) who share a channel with the user; others are absent.
   * @param {string[]} users
   * @returns {Promise<Record<string, Status & {state: string, last_seen_at: string | null}>>}
   */
  async query(users) {
    const result = await this.#presenceRequest("presence.query", { users: [...new Set(users)] });
    return result.users;
  }

  /**
   * @param {string} type
   * @param {object} payload
   * @returns {Promise<any>}
   */
  #presenceRequest(type, payload) {
    if (this.#stopped) return Promise.reject(new Error("the client is stopped"));
    /** @type {PresenceRequest} */
    const request = { type, payload, resolve() {}, reject() {}, sent: null };
    const promise = new Promise((resolve, reject) => Object.assign(request, { resolve, reject }));
    this.#presenceRequests.push(request);
    this.#sendPresence(request);
    return promise;
  }

  /** @param {PresenceRequest} request */
  #sendPresence(request) {
    if (!this.#live || !this.#socket || request.sent === this.#serial) return;
    request.sent = this.#serial;
    this.#socket.send(JSON.stringify({ type: request.type, payload: request.payload }));
  }

  /**
   * Answer the oldest request of `type`.
   * @param {string} type
   * @param {(request: PresenceRequest) => void} settle
   */
  #settlePresence(type, settle) {
    const index = this.#presenceRequests.findIndex((request) => request.type === type && request.sent === this.#serial);
    if (index < 0) return false;
    settle(this.#presenceRequests.splice(index, 1)[0]);
    return true;
  }

  /** The connected user, from the first connection.ack. */
  get user() {
    return this.#user;
  }

  /** Whether a connection is up (acknowledged and not closed). */
  get connected() {
    return this.#live;
  }

  /** The highest contiguous seq delivered per channel: keep it to start a later client from it. */
  get cursor() {
    return Object.fromEntries(this.#positions);
  }

  /**
   * Connect; resolves once connection.ack and presence.snapshot arrived. A page has nobody to
   * report a network failure to, so the first connection is retried like any later one; the
   * promise rejects only when the client stops (a refusal, or close()).
   * @returns {Promise<void>}
   */
  connect() {
    if (this.#started) throw new Error("connect() was already called");
    this.#started = true;
    return new Promise((resolve, reject) => {
      this.#ready = { resolve, reject };
      this.#open();
    });
  }

  /** Close the connection and stop reconnecting; pending sends reject. */
  close() {
    this.#stop(1000, "closed");
  }

  /**
   * Send a message; resolves with its ack once the server stored it. Sent again with the same
   * idem_key after a reconnect until acknowledged, so it lands once.
   * @param {string} channel
   * @param {string} text
   * @param {string} [idemKey]
   * @returns {Promise<MessageAck>}
   */
  send(channel, text, idemKey = newIdemKey()) {
    if (this.#stopped) return Promise.reject(new Error("the client is stopped"));
    if (text.length < 1 || text.length > MAX_TEXT_LENGTH) {
      return Promise.reject(new RangeError(`text is 1 to ${MAX_TEXT_LENGTH} characters`));
    }
    const key = `${channel} ${idemKey}`;
    const existing = this.#pending.get(key);
    if (existing) return existing.promise;
    /** @type {SendRequest} */
    const request = { payload: { idem_key: idemKey, channel, text }, promise: Promise.resolve(), resolve() {}, reject() {}, sent: null };
    request.promise = new Promise((resolve, reject) => Object.assign(request, { resolve, reject }));
    this.#pending.set(key, request);
    this.#transmit(request);
    return request.promise;
  }

  /**
   * Signal the channel's other members (`name`, e.g. "typing"; `data`, a small JSON object). Fire
   * and forget: nothing answers a relayed signal, and one sent while disconnected is dropped
   * (signals are never stored). A refusal comes as a "relay-error" of type `signal`:
   * `not_a_member`, `rate_limited` (more than 2 a second in one channel) or `signals_disabled`.
   * @param {string} channel
   * @param {string} name
   * @param {Record<string, unknown>} [data]
   */
  signal(channel, name, data = {}) {
    if (name.length < 1 || name.length > MAX_SIGNAL_NAME_LENGTH) {
      throw new RangeError(`name is 1 to ${MAX_SIGNAL_NAME_LENGTH} characters`);
    }
    if (new TextEncoder().encode(JSON.stringify(data)).length > MAX_SIGNAL_DATA_BYTES) {
      throw new RangeError(`data is at most ${MAX_SIGNAL_DATA_BYTES} bytes as JSON`);
    }
    const socket = this.#socket;
    if (!this.#live || !socket) return;
    socket.send(JSON.stringify({ type: "signal", payload: { channel, name, data } }));
  }

  // ── the connection loop ────────────────────────────────────────────────────
  async #open() {
    let token;
    try {
      token = await this.#freshToken();
    } catch {
      this.#retry(1006);
      return;
    }
    if (this.#stopped) return;
    if (this.#refused && token === this.#refused.token) {
      this.#stop(this.#refused.code, "refused");
      return;
    }
    this.#refused = null;
    let query = `token=${encodeURIComponent(token)}&device=${this.#device}`;
    const cursor = this.#positions.size ? JSON.stringify(Object.fromEntries(this.#positions)) : null;
    // A cursor that would bring the URL near the server's 16 KB request head goes as the first frame.
    const byFrame = cursor !== null && cursor.length > MAX_URL_CURSOR_CHARS;
    if (byFrame) query += "&resume=frame";
    else if (cursor !== null) query += `&cursor=${encodeURIComponent(cursor)}`;
    const socket = new WebSocket(`${this.#url}/v1/ws?${query}`);
    const serial = ++this.#serial;
    this.#socket = socket;
    if (byFrame) socket.onopen = () => socket.send(`{"type":"resume","payload":{"cursor":${cursor}}}`);
    let acked = false;
    let ackedAt = 0;
    let snapshotted = false;
    // The ack and the snapshot must come in time; after them, nothing is due.
    const deadline = setTimeout(() => snapshotted || socket.close(1000, "no ack and snapshot in time"), this.#openTimeoutMs);
    socket.onmessage = (event) => {
      if (socket !== this.#socket) return;
      const frame = parseFrame(event.data);
      if (frame === null) return; // unknown or malformed: the server may add types
      if (!acked) {
        if (frame.type !== "connection.ack") return;
        acked = true;
        ackedAt = Date.now();
        this.#onAck(frame.payload);
        return;
      }
      if (frame.type === "presence.snapshot") snapshotted = true;
      this.#onFrame(frame);
    };
    socket.onclose = (event) => {
      clearTimeout(deadline);
      if (socket !== this.#socket) return;
      this.#socket = null;
      this.#live = false;
      if (acked) this.#onDisconnected();
      if (REFUSALS.has(event.code)) {
        if (typeof this.#tokenSource === "string") {
          this.#stop(event.code, "refused");
          return;
        }
        this.#refused = { code: event.code, token };
      }
      // An acknowledgement alone is not a connection that worked: it must also have stayed up.
      if (acked && Date.now() - ackedAt >= this.#stableAfterMs) this.#failures = 0;
      this.#retry(event.code, acked && serial === this.#serial);
    };
  }

  async #freshToken() {
    const source = this.#tokenSource;
    const token = typeof source === "string" ? source : await source();
    if (typeof token !== "string" || !token) throw new TypeError("the token function must return a non-empty string");
    this.#token = token;
    return token;
  }

  /**
   * Wait out the back-off, then connect again.
   * @param {number} code the close code that ended the last attempt
   * @param {boolean} [announce] whether an acknowledged connection just ended
   */
  #retry(code, announce = false) {
    // Jittered, so the clients of a dead instance spread their returns over the survivors.
    const ceiling = Math.min(this.#retryCapMs, this.#retryBaseMs * 2 ** Math.min(this.#failures, 32));
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this.#failures += 1;
    if (announce) this.#emit("disconnected", { code, retryInMs: delay });
    this.#retryTimer = setTimeout(() => this.#open(), delay);
  }

  /**
   * @param {number} code
   * @param {string} reason
   */
  #stop(code, reason) {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#live = false;
    clearTimeout(this.#retryTimer);
    const socket = this.#socket;
    this.#socket = null;
    socket?.close(1000);
    const error = Object.assign(new Error(`the client stopped: ${reason} (${code})`), { code });
    for (const request of this.#pending.values()) request.reject(error);
    this.#pending.clear();
    for (const request of this.#presenceRequests) request.reject(error);
    this.#presenceRequests = [];
    if (this.#ready) this.#ready.reject(error);
    this.#ready = null;
    if (reason !== "closed") this.#emit("stopped", { code });
  }

  /** @param {ConnectionAck} ack */
  #onAck(ack) {
    if (this.#user === null) this.#user = ack.user;
    this.#live = true;
    if (!this.#ready) this.#emit("reconnected", ack);
    else this.#emit("connected", ack);
    // A channel the cursor did not name (the first connection, or one joined while away): its
    // history comes from the endpoint, merged with the live messages as they arrive.
    for (const channel of ack.channels) {
      if (!this.#positions.has(channel)) {
        this.#positions.set(channel, 0);
        this.#fill(channel, true, 0);
      }
    }
    if (this.#idle) this.#socket?.send(JSON.stringify({ type: "presence.activity", payload: { idle: true } }));
    for (const request of this.#pending.values()) this.#transmit(request);
    for (const request of this.#presenceRequests) this.#sendPresence(request);
  }

  /** @param {{type: string, payload: any}} frame */
  #onFrame({ type, payload }) {
    if (type === "presence.snapshot") this.#onSnapshot(payload);
    else if (type === "presence.changed") {
      if (payload.state === "online") this.#online.add(payload.user);
      else {
        this.#online.delete(payload.user);
        this.#statuses.delete(payload.user);
      }
      this.#emit("presence", payload);
    } else if (type === "presence.occupancy" && payload.large === false) {
      // The channel is no longer large: its count ends, and its people come as presence events.
      this.#occupancy.delete(payload.channel);
      this.#emit("occupancy", { channel: payload.channel, online: null });
    } else if (type === "presence.occupancy") {
      this.#occupancy.set(payload.channel, payload.online);
      this.#emit("occupancy", { channel: payload.channel, online: payload.online });
    } else if (type === "presence.status") {
      const { user, status, text, emoji, until, idle } = payload;
      this.#statuses.set(user, { status, text, emoji, until, idle });
      if (user === this.#user && typeof payload.invisible === "boolean") {
        this.#own = payload;
        this.#settlePresence("presence.set", (request) => request.resolve(payload));
      }
      this.#emit("status", payload);
    } else if (type === "presence.result") {
      this.#settlePresence("presence.query", (request) => request.resolve(payload));
    } else if (type === "message.created") this.#accept(payload);
    else if (type === "signal") this.#emit("signal", payload);
    else if (type === "message.ack") {
      const request = this.#pending.get(`${payload.channel} ${payload.idem_key}`);
      if (request) {
        this.#pending.delete(`${payload.channel} ${payload.idem_key}`);
        request.resolve(payload);
      }
    } else if (type === "error" && payload.code === "rate_limited") {
      this.#sendAgainAfter(payload.retry_after_ms ?? 1000);
    } else if (type === "error") {
      const refusal = () => Object.assign(new Error(`${payload.code}: ${payload.message}`), payload);
      if (payload.type === "message.send" && this.#refuseOldestSend(payload)) return;
      if (this.#settlePresence(payload.type, (request) => request.reject(refusal()))) return;
      this.#emit("relay-error", payload);
    }
  }

  /** @param {PresenceSnapshot} snapshot */
  #onSnapshot({ online, status = {}, occupancy = {} }) {
    const now = new Set(online);
    const counts = new Map(Object.entries(occupancy));
    this.#statuses = new Map(Object.entries(status));
    if (this.#ready) {
      this.#online = now;
      this.#occupancy = counts;
      this.#ready.resolve();
      this.#ready = null;
      return;
    }
    // After a reconnect the page hears what changed while it was away, as changes.
    for (const user of [...now].filter((user) => !this.#online.has(user)).sort()) {
      this.#online.add(user);
      this.#emit("presence", { user, state: "online" });
    }
    for (const user of [...this.#online].filter((user) => !now.has(user)).sort()) {
      this.#online.delete(user);
      this.#emit("presence", { user, state: "offline" });
    }
    const before = this.#occupancy;
    this.#occupancy = counts;
    for (const channel of [...counts.keys()].sort()) {
      const count = /** @type {number} */ (counts.get(channel));
      if (before.get(channel) !== count) this.#emit("occupancy", { channel, online: count });
    }
    for (const channel of [...before.keys()].filter((channel) => !counts.has(channel)).sort()) {
      this.#emit("occupancy", { channel, online: null });
    }
  }

  #onDisconnected() {
    // The resume sends everything after the contiguous position again: what was held is
    // redundant, and a fill in progress would only race it (it checks the serial).
    this.#held.clear();
    this.#fills.clear();
  }

  /**
   * An error about message.send answers the oldest send in flight on this connection: Relay
   * answers one connection's frames in the order they came.
   * @param {ErrorPayload} error
   */
  #refuseOldestSend(error) {
    let oldest = null;
    for (const [key, request] of this.#pending) {
      if (request.sent?.[0] === this.#serial && (!oldest || request.sent[1] < oldest[1].sent[1])) oldest = [key, request];
    }
    if (!oldest) return false;
    this.#pending.delete(oldest[0]);
    oldest[1].reject(Object.assign(new Error(`${error.code}: ${error.message}`), { code: error.code }));
    return true;
  }

  /**
   * The server names no frame in a `rate_limited` error: every send in flight on this connection
   * goes again once the wait is over (a send is idempotent; one answered meanwhile is gone).
   * @param {number} delayMs
   */
  #sendAgainAfter(delayMs) {
    if (this.#retrying) return;
    this.#retrying = true;
    const serial = this.#serial;
    setTimeout(() => {
      this.#retrying = false;
      if (serial !== this.#serial) return; // a new connection sent them all already
      for (const request of this.#pending.values()) {
        if (request.sent?.[0] !== serial) continue;
        request.sent = null;
        this.#transmit(request);
      }
    }, delayMs);
  }

  /** @param {SendRequest} request */
  #transmit(request) {
    const socket = this.#socket;
    if (!this.#live || !socket || request.sent?.[0] === this.#serial) return;
    request.sent = [this.#serial, this.#order++];
    socket.send(JSON.stringify({ type: "message.send", payload: request.payload }));
  }

  // ── messages: in seq order, once ───────────────────────────────────────────
  /** @param {MessageCreated} message */
  #accept(message) {
    const { channel } = message;
    let position = this.#positions.get(channel) ?? 0;
    this.#positions.set(channel, position);
    if (message.seq <= position) return;
    let held = this.#held.get(channel);
    if (!held) this.#held.set(channel, (held = new Map()));
    if (message.seq > position + 1) {
      if (!held.has(message.seq)) held.set(message.seq, message);
      this.#fill(channel, false, this.#gapWaitMs);
      return;
    }
    /** @type {MessageCreated | undefined} */
    let next = message;
    while (next) {
      this.#emit("message", next);
      position = next.seq;
      next = held.get(position + 1);
      held.delete(position + 1);
    }
    this.#positions.set(channel, position);
    if (!held.size) this.#held.delete(channel);
  }

  /**
   * Read the channel's history after its position: to the newest (`toEnd`), then while anything is held.
   * @param {string} channel
   * @param {boolean} toEnd
   * @param {number} delayMs
   */
  async #fill(channel, toEnd, delayMs) {
    if (this.#fills.get(channel) === this.#serial) return; // a running fill reads on until nothing is held
    const serial = this.#serial;
    this.#fills.set(channel, serial);
    try {
      await new Promise((resolve) => setTimeout(resolve, delayMs));
      while (serial === this.#serial && !this.#stopped && (toEnd || this.#held.get(channel)?.size)) {
        const position = this.#positions.get(channel) ?? 0;
        const held = this.#held.get(channel);
        const limit = toEnd || !held ? HISTORY_PAGE : Math.min(HISTORY_PAGE, Math.min(...held.keys()) - 1 - position);
        const url = `${this.#httpUrl}/v1/channels/${encodeURIComponent(channel)}/messages?after=${position}&limit=${limit}`;
        let response;
        let page;
        try {
          response = await fetch(url, { headers: { Authorization: `Bearer ${this.#token}` } });
          page = response.ok ? await response.json() : null;
        } catch {
          page = null;
        }
        if (serial !== this.#serial) return;
        if (response?.status === 404) {
          this.#held.delete(channel); // no longer a member: nothing more of it will come
          return;
        }
        if (!page || !Array.isArray(page.messages)) {
          // The resume delivers the same messages: reconnecting is the fallback.
          this.#socket?.close(1000, "history unavailable");
          return;
        }
        for (const message of page.messages) {
          if (fits("message.created", message) && message.channel === channel) this.#accept(message);
        }
        if (this.#positions.get(channel) === position && (page.messages.length || this.#held.get(channel)?.size)) return;
        if (page.next_after === null || page.next_after === undefined) toEnd = false;
      }
    } finally {
      if (this.#fills.get(channel) === serial) this.#fills.delete(channel);
    }
  }

  /**
   * @param {RelayEventType} type
   * @param {unknown} detail
   */
  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

// crypto.randomUUID exists only on secure origins (https, localhost); a page opened at
// http://<LAN address> still gets 128 random bits.
function newIdemKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}
