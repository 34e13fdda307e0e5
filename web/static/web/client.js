// The Relay demo client, and the reference for client authors.
//
// Everything a client must do with Relay's WebSocket (docs/contract.md, section 3)
// is in the first half of this file: connect with a token and a cursor, apply
// presence, show each message once, send idempotently, reconnect with back-off.
// The second half only draws the page. No framework and no build step.
"use strict";

// ── The protocol ─────────────────────────────────────────────────────────────
const CLOSE_UNAUTHORIZED = 4401; // bad, expired or revoked token: retrying cannot help
const CLOSE_TOO_MANY = 4429; // this user holds too many connections already
const RETRY_BASE_MS = 500;
// A 4429 clears only when another of the user's tabs closes: hurrying just adds load.
const RETRY_TOO_MANY_BASE_MS = 10_000;
const RETRY_CAP_MS = 30_000;

const state = {
  session: null, // {token, user: {id, name}, channels: [{id, name, type, members}]}
  socket: null,
  ready: false, // true from connection.ack until the socket closes
  retries: 0, // failed attempts since the last connection.ack
  retryTimer: null,
  online: new Set(), // user ids: the snapshot, then each presence.changed in arrival order
  lastSeq: new Map(), // channel id -> highest seq shown; the next connection's cursor
  pending: new Map(), // idem_key -> message.send payload the server has not answered yet
  messages: new Map(), // channel id -> message.created payloads, in seq order
  unread: new Map(), // channel id -> messages arrived while another channel was on screen
  selected: null, // channel id on screen
};

function connect() {
  // The cursor names every channel, 0 where this page has seen nothing: the server
  // first sends what the page missed (everything, the first time), in seq order,
  // then live messages. So a reconnect loses nothing and repeats nothing.
  const cursor = Object.fromEntries(state.lastSeq);
  const query = `token=${encodeURIComponent(state.session.token)}&cursor=${encodeURIComponent(JSON.stringify(cursor))}`;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(`${scheme}//${location.host}/v1/ws?${query}`);
  socket.onmessage = (event) => {
    const frame = JSON.parse(event.data);
    // Ignore types this client does not know: the server may add new ones.
    if (Object.hasOwn(handlers, frame.type)) handlers[frame.type](frame.payload);
  };
  // Only the current socket may schedule a reconnect; a signed-out one is forgotten.
  socket.onclose = (event) => socket === state.socket && disconnected(event.code);
  state.socket = socket;
  showStatus("connecting", "Connecting…");
}

const handlers = {
  "connection.ack"() {
    state.ready = true;
    state.retries = 0;
    showStatus("connected", `Connected as ${state.session.user.name || state.session.user.id}`);
    // A send whose answer was lost with the old socket goes again with the same
    // idem_key: the server acknowledges it again and never stores it twice.
    for (const payload of state.pending.values()) send("message.send", payload);
    renderComposer();
  },
  "presence.snapshot"({ online }) {
    state.online = new Set(online);
    renderMembers();
  },
  "presence.changed"({ user, state: presence }) {
    if (presence === "online") state.online.add(user);
    else state.online.delete(user);
    renderMembers();
  },
  "message.created"(message) {
    const seen = state.lastSeq.get(message.channel);
    // Unknown channel (joined after sign-in) or already shown: the cursor means the
    // server never repeats one, and this check keeps a repeat harmless anyway.
    if (seen === undefined || message.seq <= seen) return;
    state.lastSeq.set(message.channel, message.seq);
    state.messages.get(message.channel).push(message);
    showMessage(message);
  },
  "message.ack"({ idem_key }) {
    state.pending.delete(idem_key);
  },
  error({ code, message, type }) {
    // Relay answers one connection's frames in the order they came, so an error
    // about message.send answers the oldest send still waiting.
    if (type === "message.send") state.pending.delete(state.pending.keys().next().value);
    showStatus("connected", `The server refused a ${type || "frame"}: ${code}: ${message}`);
  },
};

function disconnected(code) {
  state.socket = null;
  state.ready = false;
  state.online.clear(); // nobody's presence is known while disconnected
  renderMembers();
  renderComposer();
  if (code === CLOSE_UNAUTHORIZED) {
    signOut("Signed out: the server refused the token (expired, revoked or rotated).");
    return;
  }
  // Capped exponential back-off with jitter: when an instance dies, its clients
  // spread their reconnects instead of all arriving at the survivors at once.
  const base = code === CLOSE_TOO_MANY ? RETRY_TOO_MANY_BASE_MS : RETRY_BASE_MS;
  const ceiling = Math.min(RETRY_CAP_MS, base * 2 ** state.retries);
  const delay = ceiling / 2 + Math.random() * (ceiling / 2);
  state.retries += 1;
  const why = code === CLOSE_TOO_MANY ? "Too many open connections for this user" : "Disconnected";
  showStatus("disconnected", `${why}; retrying in ${Math.ceil(delay / 1000)} s`);
  state.retryTimer = setTimeout(connect, delay);
}

function send(type, payload) {
  state.socket.send(JSON.stringify({ type, payload }));
}

function sendMessage(channel, text) {
  const payload = { idem_key: newIdemKey(), channel, text };
  state.pending.set(payload.idem_key, payload);
  if (state.ready) send("message.send", payload); // else it goes on the next connection.ack
}

// crypto.randomUUID exists only on secure origins (https, localhost); a page opened
// at http://<LAN address> still gets 128 random bits.
function newIdemKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

// ── Signing in (the demo's shortcut: a real app's backend mints the token) ───
const SESSION_KEY = "relay.demo.session";

async function signIn(userId) {
  $("sign-in-error").textContent = "";
  const response = await fetch("/demo/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ user: userId }),
  });
  const body = await response.json();
  if (!response.ok) {
    $("sign-in-error").textContent = body.error?.message ?? `sign-in failed (${response.status})`;
    return;
  }
  sessionStorage.setItem(SESSION_KEY, JSON.stringify(body));
  start(body);
}

function start(session) {
  state.session = session;
  state.lastSeq = new Map(session.channels.map((channel) => [channel.id, 0]));
  state.messages = new Map(session.channels.map((channel) => [channel.id, []]));
  state.unread.clear();
  state.pending.clear();
  state.selected = session.channels[0]?.id ?? null;
  $("sign-in-view").hidden = true;
  $("chat-view").hidden = false;
  $("sign-out").hidden = false;
  $("whoami").hidden = false;
  $("whoami").textContent = `${session.user.name || session.user.id} (${session.user.id})`;
  renderChannel();
  connect();
}

function signOut(reason) {
  clearTimeout(state.retryTimer);
  const socket = state.socket;
  state.socket = null;
  state.ready = false;
  state.session = null;
  socket?.close(1000);
  sessionStorage.removeItem(SESSION_KEY);
  $("chat-view").hidden = true;
  $("sign-out").hidden = true;
  $("whoami").hidden = true;
  $("sign-in-view").hidden = false;
  showStatus("signed-out", reason ?? "Signed out");
}

// ── Drawing the page: data goes in through textContent only, never as HTML ───
const $ = (id) => document.getElementById(id);

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children); // strings become text nodes
  return node;
}

function showStatus(connection, text) {
  $("status").dataset.connection = connection;
  $("status").textContent = text;
}

function selectedChannel() {
  return state.session.channels.find((channel) => channel.id === state.selected);
}

function select(channelId) {
  state.selected = channelId;
  state.unread.delete(channelId);
  renderChannel();
}

function renderChannel() {
  renderChannelList();
  renderMembers();
  $("channel-name").textContent = selectedChannel() ? `#${selectedChannel().name}` : "No channels";
  $("messages").replaceChildren(...(state.messages.get(state.selected) ?? []).map(messageItem));
  renderComposer();
  scrollToEnd();
}

function renderChannelList() {
  const items = state.session.channels.map((channel) => {
    const button = el("button", { type: "button", "data-channel-name": channel.name }, `#${channel.name}`);
    if (channel.id === state.selected) button.setAttribute("aria-current", "true");
    const unread = state.unread.get(channel.id);
    if (unread) button.append(" ", el("span", { class: "badge" }, `${unread} new`));
    button.addEventListener("click", () => select(channel.id));
    return el("li", {}, button);
  });
  $("channels").replaceChildren(...items);
}

function renderMembers() {
  if (!state.session) return;
  const members = selectedChannel()?.members ?? [];
  const items = members.map((member) => {
    const presence = state.online.has(member.id) ? "online" : "offline";
    const you = member.id === state.session.user.id ? " (you)" : "";
    return el(
      "li",
      { "data-member": member.id, "data-presence": presence },
      el("span", { class: "dot", "aria-hidden": "true" }),
      `${member.name || member.id}${you}`,
      el("span", { class: "visually-hidden" }, `, ${presence}`),
    );
  });
  $("members").replaceChildren(...items);
}

function nameOf(userId) {
  const member = selectedChannel()?.members.find((m) => m.id === userId);
  return member?.name || userId;
}

function messageItem(message) {
  const when = new Date(message.created_at);
  return el(
    "li",
    { "data-seq": message.seq },
    el("span", { class: "author" }, nameOf(message.user)),
    " ",
    el("time", { datetime: message.created_at }, when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })),
    el("p", { class: "text" }, message.text),
  );
}

function showMessage(message) {
  if (message.channel === state.selected) {
    $("messages").append(messageItem(message));
    scrollToEnd();
  } else {
    state.unread.set(message.channel, (state.unread.get(message.channel) ?? 0) + 1);
    renderChannelList();
  }
}

function scrollToEnd() {
  $("messages").scrollTop = $("messages").scrollHeight;
}

function renderComposer() {
  const usable = state.ready && state.selected !== null;
  for (const control of $("composer").elements) control.disabled = !usable;
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in")?.addEventListener("submit", (event) => {
    event.preventDefault();
    signIn(event.submitter.value);
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("message-text");
    sendMessage(state.selected, input.value);
    input.value = "";
    input.focus();
  });
  // A reload keeps the tab signed in; the cursor starts at 0, so the history comes back.
  const saved = sessionStorage.getItem(SESSION_KEY);
  if (saved) start(JSON.parse(saved));
});
