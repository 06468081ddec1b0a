// The Strata console: polls the broker's JSON API every two seconds and renders three tables.
// Built with the DOM only (no framework, nothing fetched from elsewhere); every value from the
// API is put in the page as text, never as HTML.
"use strict";

const REFRESH_MS = 2000;
// A bearer token (metrics_token), or "Basic ..." credentials when the broker logs console
// users in as Kafka users (console_sasl_mechanism); kept for this tab only.
let token = sessionStorage.getItem("strata-console-token") || "";
let loginKind = sessionStorage.getItem("strata-console-login") || "token";
let page = location.hash.replace("#", "") || "cluster";
let ownersSignature = "";
const lastEnds = {};

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function status(text, error) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.className = error ? "error" : "";
}

async function api(path, body) {
  const options = { headers: {} };
  if (token) options.headers.Authorization = (loginKind === "sasl" ? "Basic " : "Bearer ") + token;
  if (body !== undefined) {
    options.method = "POST";
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  if (response.status === 401) {
    const refusal = await response.json().catch(() => ({}));
    const sasl = refusal.login === "sasl";
    document.getElementById("login-token").hidden = sasl;
    document.getElementById("login-sasl").hidden = !sasl;
    document.getElementById("username").hidden = !sasl;
    document.getElementById("token").placeholder = sasl ? "password" : "token";
    document.getElementById("login").hidden = false;
    throw new Error(refusal.error || "the console needs a login");
  }
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

function replaceRows(table, rows) {
  const body = document.querySelector(table + " tbody");
  body.replaceChildren(...rows);
}

function renderCluster(overview) {
  document.getElementById("identity").textContent =
    `broker ${overview.node_id} · ${overview.mode} · ${overview.version}`;
  const cluster = overview.cluster;
  document.getElementById("standalone").hidden = cluster !== null;
  if (!cluster) {
    replaceRows("#brokers", []);
    replaceRows("#owners", []);
    ownersSignature = "";
    return;
  }
  const live = cluster.brokers.map((b) => b.id);
  replaceRows("#brokers", cluster.brokers.map((b) => {
    const state = b.draining ? "draining" : b.drain_requested ? "drain requested" : "serving";
    const action = b.draining || b.drain_requested
      ? el("button", { class: "undrain", onclick: () => act("/api/brokers/undrain", { broker: b.id }, `undrain of broker ${b.id}`) }, "Undrain")
      : el("button", { class: "drain", onclick: () => act("/api/brokers/drain", { broker: b.id }, `drain of broker ${b.id}`) }, "Drain");
    return el("tr", { "data-broker": b.id },
      el("td", {}, b.id), el("td", {}, `${b.host}:${b.port}`),
      el("td", { class: "num partitions" }, b.partitions), el("td", { class: "num" }, b.heartbeat),
      el("td", { class: b.draining ? "draining state" : "state" }, state), el("td", {}, action));
  }));
  const owners = cluster.partitions
    .filter((p) => p.topic !== null)
    .sort((a, b) => a.topic.localeCompare(b.topic) || a.partition - b.partition);
  // Rebuilt only when something changed, and with each row's chosen target kept: a poll must
  // not reset a drop-down the operator is using.
  const signature = JSON.stringify([live, owners.map((p) => [p.topic, p.partition, p.owner, p.epoch, p.state])]);
  if (signature === ownersSignature) return;
  ownersSignature = signature;
  const chosen = {};
  for (const row of document.querySelectorAll("#owners tbody tr")) {
    const select = row.querySelector(".move-target");
    if (select) chosen[row.dataset.partition] = select.value;
  }
  replaceRows("#owners", owners.map((p) => {
    const select = el("select", { class: "move-target" },
      ...live.filter((id) => id !== p.owner).map((id) => el("option", { value: id }, `broker ${id}`)));
    const kept = chosen[`${p.topic}-${p.partition}`];
    if (kept && [...select.options].some((o) => o.value === kept)) select.value = kept;
    const button = el("button", {
      class: "move",
      onclick: () => act("/api/partitions/move",
        { topic: p.topic, partition: p.partition, broker: Number(select.value) },
        `move of ${p.topic}-${p.partition} to broker ${select.value}`),
    }, "Move");
    return el("tr", { "data-partition": `${p.topic}-${p.partition}` },
      el("td", {}, p.topic), el("td", { class: "num" }, p.partition),
      el("td", { class: "num owner" }, p.owner), el("td", { class: "num" }, p.epoch),
      el("td", { class: "state-" + p.state }, p.state),
      el("td", {}, live.length > 1 ? select : "", live.length > 1 ? button : ""));
  }));
}

function renderTopics(answer) {
  const omitted = document.getElementById("topics-omitted");
  omitted.hidden = answer.omitted === 0;
  omitted.textContent = `${answer.omitted} more topics not shown`;
  replaceRows("#topic-list", answer.topics.map((t) => {
    if (t.error) {
      return el("tr", { "data-topic": t.name }, el("td", {}, t.name), el("td", { colSpan: 6 }, t.error));
    }
    const records = t.partitions.reduce((sum, p) => sum + Math.max(0, p.log_end_offset - p.log_start_offset), 0);
    // Throughput from the log end offsets of two polls: records appended per second.
    const end = t.partitions.reduce((sum, p) => sum + Math.max(0, p.log_end_offset), 0);
    const before = lastEnds[t.name];
    const now = performance.now();
    lastEnds[t.name] = { end, at: now };
    const rate = before && now > before.at ? ((end - before.end) * 1000) / (now - before.at) : null;
    const leaders = t.partitions.map((p) => `${p.partition}→${p.leader}`).join(" ");
    const set = Object.entries(t.configs)
      .filter(([, c]) => c.source === "topic")
      .map(([k, c]) => `${k}=${c.value ?? "(hidden)"}`).join(", ");
    return el("tr", { "data-topic": t.name },
      el("td", {}, t.name), el("td", { class: "num" }, t.partitions.length),
      el("td", { class: "num records" }, records),
      el("td", { class: "num size" }, t.size_bytes === null ? "?" : bytes(t.size_bytes)),
      el("td", { class: "num rate" }, rate === null ? "…" : rate.toFixed(1)),
      el("td", { class: "leaders" }, leaders),
      el("td", {}, set || "—"));
  }));
}

function renderGroups(answer) {
  const omitted = document.getElementById("groups-omitted");
  omitted.hidden = answer.omitted === 0;
  omitted.textContent = `${answer.omitted} more groups not shown`;
  replaceRows("#group-list", answer.groups.map((g) => {
    const lag = g.lag ? g.lag.total_lag : "?";
    const lines = g.lag
      ? g.lag.partitions.map((p) => el("div", { class: "lagline" },
          `${p.topic}-${p.partition}: committed ${p.committed_offset}, end ${p.log_end_offset}, lag ${p.lag}`))
      : [g.error || ""];
    return el("tr", { "data-group": g.group },
      el("td", {}, g.group), el("td", {}, g.type), el("td", {}, g.state),
      el("td", { class: "num members" }, g.members ? g.members.length : 0),
      el("td", { class: "num lag" }, lag), el("td", {}, ...lines));
  }));
}

async function act(path, body, what) {
  status(`requesting ${what}…`);
  try {
    await api(path, body);
    status(`requested ${what}`);
    refresh();
  } catch (e) {
    status(`${what} failed: ${e.message}`, true);
  }
}

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    renderCluster(await api("/api/overview"));
    if (page === "topics") renderTopics(await api("/api/topics"));
    if (page === "groups") renderGroups(await api("/api/groups"));
    document.body.dataset.loaded = page;
    if (!document.getElementById("status").classList.contains("error")) {
      status(`updated ${new Date().toLocaleTimeString()}`);
    }
  } catch (e) {
    status(e.message, true);
  } finally {
    refreshing = false;
  }
}

function show(name) {
  page = name;
  history.replaceState(null, "", "#" + name);
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== name;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  delete document.body.dataset.loaded;
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => show(tab.dataset.tab));
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const user = document.getElementById("username");
    loginKind = user.hidden ? "token" : "sasl";
    const secret = document.getElementById("token").value;
    // HTTP Basic: base64 of the UTF-8 bytes of "user:password".
    token = loginKind === "sasl"
      ? btoa(String.fromCharCode(...new TextEncoder().encode(user.value + ":" + secret)))
      : secret;
    sessionStorage.setItem("strata-console-token", token);
    sessionStorage.setItem("strata-console-login", loginKind);
    document.getElementById("login").hidden = true;
    status("");
    refresh();
  });
  document.getElementById("create-topic").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const configs = {};
    for (const pair of form.configs.value.split(",").map((p) => p.trim()).filter(Boolean)) {
      const at = pair.indexOf("=");
      if (at < 1) { status(`config ${pair} is not key=value`, true); return; }
      configs[pair.slice(0, at).trim()] = pair.slice(at + 1).trim();
    }
    const body = { name: form.name.value, configs };
    if (form.partitions.value) body.partitions = Number(form.partitions.value);
    await act("/api/topics", body, `creation of topic ${form.name.value}`);
    form.reset();
  });
  show(page);
  setInterval(refresh, REFRESH_MS);
});
