// @ts-check
// The Relay demo page: the demo's sign-in and the drawing. Everything about the connection —
// reconnects, resume, gap filling, presence, idempotent sends — is client.js's; this file only
// turns its events into the page. No framework and no build step.
import { CLOSE_TOO_MANY, CLOSE_UNAUTHORIZED, RelayClient } from "./client.js";

/** @typedef {import("./client.js").MessageCreated} MessageCreated */
/** @typedef {{id: string, name: string}} Member */
/**
 * A channel of the session; a large one comes without its members (`members` is empty): the page
 * shows how many are online instead (docs/contract.md, Large rooms).
 * @typedef {{id: string, name: string, type: string, large: boolean, member_count: number, members: Member[]}} Channel
 */
/** @typedef {{token: string, user: Member, channels: Channel[]}} Session */

const SESSION_KEY = "relay.demo.session";
// Typing: signalled at most once per TYPING_EVERY_MS per channel (the server takes 2 a second),
// and shown for TYPING_SHOWN_MS after the last one heard, or until that person's message arrives.
const TYPING_EVERY_MS = 1500;
const TYPING_SHOWN_MS = 3000;

const state = {
  /** @type {Session | null} */
  session: null,
  /** @type {RelayClient | null} */
  client: null,
  /** @type {Map<string, MessageCreated[]>} channel id -> messages, in seq order */
  messages: new Map(),
  /** @type {Map<string, number>} channel id -> messages arrived while another channel was on screen */
  unread: new Map(),
  /** @type {string | null} channel id on screen */
  selected: null,
  /** @type {Map<string, string | null>} member id -> when last seen (ISO-8601), for offline members */
  lastSeen: new Map(),
  /** @type {boolean | undefined} the invisibility the toggle last showed */
  shownInvisible: undefined,
  /** @type {Map<string, Map<string, number>>} channel id -> user id -> timer that hides their "typing" */
  typing: new Map(),
  /** @type {Map<string, number>} channel id -> when this page last signalled typing there */
  typingSent: new Map(),
};

// The page reports idle after this long without input (`?idle_ms=` shortens it for a try-out).
const IDLE_AFTER_MS = Number(new URLSearchParams(location.search).get("idle_ms")) || 60_000;

// ── Signing in (the demo's shortcut: a real app's backend mints the token) ───
/** @param {string} userId */
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

/** @param {Session} session */
function start(session) {
  state.session = session;
  state.messages = new Map(session.channels.map((channel) => [channel.id, []]));
  state.unread.clear();
  state.selected = session.channels[0]?.id ?? null;
  $("sign-in-view").hidden = true;
  $("chat-view").hidden = false;
  $("sign-out").hidden = false;
  $("whoami").hidden = false;
  $("whoami").textContent = `${session.user.name || session.user.id} (${session.user.id})`;
  renderChannel();

  // The cursor names every channel at 0: the page shows each channel's history, then live messages.
  const cursor = Object.fromEntries(session.channels.map((channel) => [channel.id, 0]));
  const client = new RelayClient({ token: session.token, cursor });
  state.client = client;
  client.addEventListener("connected", () => connected(client));
  client.addEventListener("reconnected", () => connected(client));
  client.addEventListener("disconnected", (event) => {
    const { retryInMs } = /** @type {CustomEvent} */ (event).detail;
    showStatus("disconnected", `Disconnected; retrying in ${Math.ceil(retryInMs / 1000)} s`);
    renderMembers();
    renderComposer();
  });
  client.addEventListener("stopped", (event) => {
    const { code } = /** @type {CustomEvent} */ (event).detail;
    if (code === CLOSE_UNAUTHORIZED) signOut("Signed out: the server refused the token (expired, revoked or rotated).");
    else if (code === CLOSE_TOO_MANY) showStatus("disconnected", "Too many open connections for this user: close another tab, then reload this one.");
  });
  client.addEventListener("presence", (event) => {
    if (/** @type {CustomEvent} */ (event).detail.state === "offline") refreshLastSeen();
    renderMembers();
  });
  client.addEventListener("occupancy", (event) => {
    const { channel, online } = /** @type {CustomEvent} */ (event).detail;
    if (online === null) relearnChannel(channel);
    else if (channel === state.selected) renderMembers();
  });
  client.addEventListener("status", () => {
    renderMembers();
    renderOwnStatus();
  });
  client.addEventListener("message", (event) => showMessage(/** @type {CustomEvent} */ (event).detail));
  client.addEventListener("signal", (event) => heardSignal(/** @type {CustomEvent} */ (event).detail));
  client.addEventListener("relay-error", (event) => {
    const { code, message, type } = /** @type {CustomEvent} */ (event).detail;
    showStatus("connected", `The server refused a ${type || "frame"}: ${code}: ${message}`);
  });
  showStatus("connecting", "Connecting…");
  // A refusal is handled by "stopped"; the promise only says the first snapshot is in, and with
  // it the large channels' counts (no event brings them).
  client.connect().then(
    () => client === state.client && renderMembers(),
    () => {},
  );
}

/** @param {RelayClient} client */
function connected(client) {
  if (client !== state.client || !state.session) return;
  showStatus("connected", `Connected as ${state.session.user.name || state.session.user.id}`);
  renderMembers();
  renderComposer();
  renderOwnStatus();
  refreshLastSeen();
}

/**
 * A channel counted no more (it became small): drawn by its people from now on. A channel that was
 * large at sign-in came without its members, so the page asks for its session's channels again.
 * @param {string} channelId
 */
async function relearnChannel(channelId) {
  const channel = state.session?.channels.find((known) => known.id === channelId);
  if (!channel) return;
  channel.large = false;
  if (!channel.members.length) {
    const response = await fetch("/demo/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ user: state.session?.user.id }),
    });
    const fresh = response.ok ? (await response.json()).channels.find((known) => known.id === channelId) : null;
    if (fresh) Object.assign(channel, fresh);
  }
  if (channelId === state.selected) renderMembers();
}

/** Ask when the offline members of the page's channels were last seen (up to 100 at a time). */
async function refreshLastSeen() {
  const client = state.client;
  if (!client?.connected || !state.session) return;
  const members = new Set(state.session.channels.flatMap((channel) => channel.members.map((member) => member.id)));
  const offline = [...members].filter((id) => !client.online.has(id)).slice(0, 100);
  if (!offline.length) return;
  try {
    const users = await client.query(offline);
    for (const [id, user] of Object.entries(users)) state.lastSeen.set(id, user.last_seen_at);
    renderMembers();
  } catch {
    // Rate-limited or disconnected: the next change asks again.
  }
}

/** @param {HTMLFormElement} form */
async function setOwnStatus(form) {
  const client = state.client;
  if (!client) return;
  const seconds = Number(form.elements.namedItem("until").value);
  /** @type {Record<string, string | boolean | null>} */
  const fields = {
    status: form.elements.namedItem("status").value,
    text: form.elements.namedItem("text").value,
    emoji: form.elements.namedItem("emoji").value,
    until: seconds ? new Date(Date.now() + seconds * 1000).toISOString() : null,
  };
  const invisible = /** @type {HTMLInputElement} */ (form.elements.namedItem("invisible")).checked;
  if (invisible !== client.invisible) fields.invisible = invisible;
  try {
    await client.setStatus(fields);
  } catch (error) {
    showStatus("connected", `The server refused the status: ${/** @type {Error} */ (error).message}`);
  }
}

function renderOwnStatus() {
  const own = state.client?.ownStatus;
  if (!own) return;
  const until = own.until ? ` until ${new Date(own.until).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })}` : "";
  $("own-status").textContent = `You are ${own.status}${own.text ? ` — ${own.text}` : ""}${until}${own.invisible ? " (invisible)" : ""}`;
  // The toggle follows the server only when invisibility changed (another tab, a reconnect):
  // an idle flip must not undo a box ticked but not yet submitted.
  if (own.invisible !== state.shownInvisible) $("status-invisible").checked = own.invisible === true;
  state.shownInvisible = own.invisible;
}

/** @param {string | null | undefined} when */
function ago(when) {
  if (!when) return "never seen";
  const minutes = Math.round((Date.now() - new Date(when).getTime()) / 60_000);
  if (minutes < 1) return "last seen just now";
  if (minutes < 60) return `last seen ${minutes} min ago`;
  return `last seen ${new Date(when).toLocaleString()}`;
}

// Idle: no key, pointer or focus for IDLE_AFTER_MS. Only a change is told (presence.activity is rate-limited).
/** @type {ReturnType<typeof setTimeout> | undefined} */
let idleTimer;
function active() {
  if (state.client?.idle) state.client.setIdle(false);
  clearTimeout(idleTimer);
  idleTimer = setTimeout(() => state.client?.setIdle(true), IDLE_AFTER_MS);
}
for (const kind of ["keydown", "pointerdown", "pointermove", "focus"]) addEventListener(kind, active, { passive: true });
active();

/** @param {string} [reason] */
function signOut(reason) {
  const client = state.client;
  state.client = null;
  state.session = null;
  client?.close();
  sessionStorage.removeItem(SESSION_KEY);
  $("chat-view").hidden = true;
  $("sign-out").hidden = true;
  $("whoami").hidden = true;
  $("sign-in-view").hidden = false;
  showStatus("signed-out", reason ?? "Signed out");
}

/**
 * @param {string} channel
 * @param {string} text
 */
async function sendMessage(channel, text) {
  try {
    await state.client?.send(channel, text);
  } catch (error) {
    if (state.client) showStatus("connected", `The server refused the message: ${/** @type {Error} */ (error).message}`);
  }
}

/** Tell the channel's other members this user is typing, no more often than the server allows. */
function signalTyping() {
  const channel = state.selected;
  if (!channel || !state.client?.connected) return;
  const now = Date.now();
  if (now - (state.typingSent.get(channel) ?? 0) < TYPING_EVERY_MS) return;
  state.typingSent.set(channel, now);
  state.client.signal(channel, "typing");
}

/** @param {import("./client.js").Signal} signal */
function heardSignal({ channel, user, name }) {
  if (name !== "typing") return;
  const typists = state.typing.get(channel) ?? new Map();
  state.typing.set(channel, typists);
  clearTimeout(typists.get(user));
  typists.set(user, window.setTimeout(() => stoppedTyping(channel, user), TYPING_SHOWN_MS));
  renderTyping();
}

/**
 * @param {string} channel
 * @param {string} user
 */
function stoppedTyping(channel, user) {
  const typists = state.typing.get(channel);
  clearTimeout(typists?.get(user));
  typists?.delete(user);
  renderTyping();
}

// ── Drawing the page: data goes in through textContent only, never as HTML ───
/** @param {string} id */
const $ = (id) => /** @type {HTMLElement & HTMLFormElement & HTMLInputElement} */ (document.getElementById(id));

/**
 * @param {string} tag
 * @param {Record<string, string | number>} attributes
 * @param {(Node | string)[]} children
 */
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  node.append(...children); // strings become text nodes
  return node;
}

/**
 * @param {string} connection
 * @param {string} text
 */
function showStatus(connection, text) {
  $("status").dataset.connection = connection;
  $("status").textContent = text;
}

function selectedChannel() {
  return state.session?.channels.find((channel) => channel.id === state.selected);
}

/** @param {string} channelId */
function select(channelId) {
  state.selected = channelId;
  state.unread.delete(channelId);
  renderChannel();
}

function renderChannel() {
  renderChannelList();
  renderMembers();
  const channel = selectedChannel();
  $("channel-name").textContent = channel ? `#${channel.name}` : "No channels";
  $("messages").replaceChildren(...(state.messages.get(state.selected ?? "") ?? []).map(messageItem));
  renderTyping();
  renderComposer();
  scrollToEnd();
}

function renderChannelList() {
  const items = (state.session?.channels ?? []).map((channel) => {
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
  const channel = selectedChannel();
  // Nobody's presence is known while disconnected: the dots go grey until the next snapshot.
  const online = state.client?.connected ? state.client.online : new Set();
  const count = state.client?.connected && channel ? state.client.occupancy.get(channel.id) : undefined;
  // Counted: large when signed in, or turned large since (its first presence.occupancy).
  if (channel && (channel.large || count !== undefined)) {
    $("members").replaceChildren(occupancyItem(channel, count));
    return;
  }
  const statuses = state.client?.statuses ?? {};
  const members = channel?.members ?? [];
  const items = members.map((member) => {
    const presence = online.has(member.id) ? "online" : "offline";
    const you = member.id === state.session?.user.id ? " (you)" : "";
    const status = presence === "online" ? statuses[member.id] : undefined;
    /** @type {Record<string, string>} */
    const attributes = { "data-member": member.id, "data-presence": presence };
    const details = [];
    if (status) {
      attributes["data-status"] = status.status;
      attributes["data-idle"] = String(status.idle);
      const words = [status.status === "available" ? "" : status.status, status.emoji, status.text].filter(Boolean).join(" ");
      if (words) details.push(el("span", { class: "status-note" }, words));
      if (status.idle) details.push(el("span", { class: "status-note", "data-idle-marker": "" }, "idle"));
    } else if (presence === "offline" && state.lastSeen.has(member.id)) {
      details.push(el("span", { class: "last-seen" }, ago(state.lastSeen.get(member.id))));
    }
    return el(
      "li",
      attributes,
      el("span", { class: "dot", "aria-hidden": "true" }),
      `${member.name || member.id}${you}`,
      ...details,
      el("span", { class: "visually-hidden" }, `, ${presence}`),
    );
  });
  $("members").replaceChildren(...items);
}

/**
 * One line for a large channel: "12 online of 4,000 members" (the count unknown while disconnected).
 * @param {Channel} channel
 * @param {number | undefined} count
 */
function occupancyItem(channel, count) {
  const presence = count ? "online" : "offline";
  return el(
    "li",
    { "data-occupancy": count ?? "", "data-presence": presence },
    el("span", { class: "dot", "aria-hidden": "true" }),
    el("span", { class: "online-count" }, `${count ?? "…"} online`),
    " ",
    el("span", { class: "member-count" }, `of ${channel.member_count.toLocaleString()} members`),
  );
}

/** @param {string} userId */
function nameOf(userId) {
  const member = selectedChannel()?.members.find((m) => m.id === userId);
  return member?.name || userId;
}

/** @param {MessageCreated} message */
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

/** @param {MessageCreated} message */
function showMessage(message) {
  const shown = state.messages.get(message.channel);
  // A channel joined after sign-in is not on this page: the demo lists the channels of its session.
  if (!shown) return;
  stoppedTyping(message.channel, message.user);
  shown.push(message);
  if (message.channel === state.selected) {
    $("messages").append(messageItem(message));
    scrollToEnd();
  } else {
    state.unread.set(message.channel, (state.unread.get(message.channel) ?? 0) + 1);
    renderChannelList();
  }
}

function renderTyping() {
  const names = [...(state.typing.get(state.selected ?? "")?.keys() ?? [])].map(nameOf);
  $("typing").textContent =
    names.length === 0 ? "" : names.length === 1 ? `${names[0]} is typing…` : `${names.join(", ")} are typing…`;
}

function scrollToEnd() {
  $("messages").scrollTop = $("messages").scrollHeight;
}

function renderComposer() {
  const usable = Boolean(state.client?.connected) && state.selected !== null;
  for (const control of $("composer").elements) /** @type {HTMLInputElement} */ (control).disabled = !usable;
}

// A module runs once the document is parsed, like a deferred script.
$("sign-in")?.addEventListener("submit", (event) => {
  event.preventDefault();
  const submitter = /** @type {HTMLButtonElement} */ (/** @type {SubmitEvent} */ (event).submitter);
  signIn(submitter.value);
});
$("sign-out").addEventListener("click", () => signOut());
$("status-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setOwnStatus(/** @type {HTMLFormElement} */ (event.target));
});
$("message-text").addEventListener("input", () => signalTyping());
$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("message-text");
  if (state.selected !== null) sendMessage(state.selected, input.value);
  input.value = "";
  input.focus();
});
// A reload keeps the tab signed in; the cursor starts at 0, so the history comes back.
const saved = sessionStorage.getItem(SESSION_KEY);
if (saved) start(JSON.parse(saved));
