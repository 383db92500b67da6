// siwa-events dashboard. Every value from the API is attacker-influenced (notification fields,
// rejected bodies): it only ever reaches the page through textContent / setAttribute, never as
// markup. The token lives in sessionStorage and travels only in the Authorization header.
"use strict";

const $ = (selector) => document.querySelector(selector);
const svgNS = "http://www.w3.org/2000/svg";
let nextCursor = null;
let chartData = null;

function token() { return sessionStorage.getItem("siwa-token"); }

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: "Bearer " + token() } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.message || ("HTTP " + response.status));
    error.status = response.status;
    throw error;
  }
  return body;
}

// MARK: Building blocks (text only)

/** An element with text (never markup), a class and attributes. */
function el(tag, options = {}, children = []) {
  const node = document.createElement(tag);
  if (options.className) node.className = options.className;
  if (options.text != null) node.textContent = String(options.text);
  if (options.title != null) node.title = String(options.title);
  for (const [name, value] of Object.entries(options.attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function cell(row, content, className) {
  const td = el("td", { className });
  if (content == null || content === "") td.append(el("span", { className: "none", text: "–" }));
  else if (content instanceof Node) td.append(content);
  else td.textContent = String(content);
  row.appendChild(td);
  return td;
}

/** "2026-11-25 14:20:42" (UTC) with the full ISO time on hover. */
function time(iso) {
  if (!iso) return null;
  return el("time", { className: "ts", text: String(iso).slice(0, 19).replace("T", " "), attrs: { datetime: iso }, title: iso });
}

function duration(startISO, endISO) {
  const ms = Date.parse(endISO) - Date.parse(startISO);
  if (!Number.isFinite(ms)) return null;
  return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + " s";
}

// Statuses and outcomes: the word, on a colour that says good / in progress / needs a look / bad.
const tones = {
  applied: "good", delivered: "good", completed: "good", resolved: "good", active: "good",
  pending: "info", available: "info", running: "info",
  retrying: "warn", retryable: "warn", lease_expired: "warn", silenced: "muted",
  discarded: "bad", firing: "bad", revoked: "bad", expired: "muted", skipped: "muted",
};
const typeClasses = {
  "consent-revoked": "type-revoked", "account-delete": "type-delete", "email-disabled": "type-email-off", "email-enabled": "type-email-on",
};

function badge(value) {
  if (value == null) return null;
  return el("span", { className: "badge tone-" + (tones[value] || "neutral"), text: value });
}

function typeTag(value) {
  if (value == null) return null;
  return el("span", { className: "tag " + (typeClasses[value] || "type-other"), text: value });
}

function laneTag(value) {
  return el("span", { className: "lane", text: value });
}

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = el("textarea", { className: "visually-hidden" });
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.classList.add("copied");
  button.title = "Copied";
  setTimeout(() => { button.classList.remove("copied"); button.title = "Copy " + text; }, 1200);
}

function copyIcon() {
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("aria-hidden", "true");
  for (const [x, y] of [[5, 5], [2, 2]]) {
    const rect = document.createElementNS(svgNS, "rect");
    rect.setAttribute("x", String(x)); rect.setAttribute("y", String(y));
    rect.setAttribute("width", "9"); rect.setAttribute("height", "9"); rect.setAttribute("rx", "1.5");
    svg.append(rect);
  }
  return svg;
}

function copyButton(value) {
  const button = el("button", { className: "copy", title: "Copy " + value, attrs: { type: "button", "aria-label": "Copy " + value } }, [copyIcon()]);
  button.addEventListener("click", (event) => { event.stopPropagation(); copy(value, button); });
  return button;
}

/** A long identifier as its first and last characters, the whole value in its title, with a
 *  copy button. `onOpen` makes the short form a link-like button. */
function shortId(value, options = {}) {
  if (value == null) return null;
  const full = String(value);
  const head = options.head ?? 8, tail = options.tail ?? 4;
  const text = full.length > head + tail + 1 ? full.slice(0, head) + "…" + full.slice(-tail) : full;
  const label = options.onOpen
    ? el("button", { className: "link id", text, title: full, attrs: { type: "button", "data-full": full } })
    : el("span", { className: "id", text, title: full, attrs: { "data-full": full } });
  if (options.onOpen) label.addEventListener("click", (event) => { event.stopPropagation(); options.onOpen(); });
  return el("span", { className: "idbox" }, [label, copyButton(full)]);
}

/** Names each cell after its column, for the phone layout that shows rows as cards. */
function labelCells(table) {
  const names = Array.from(table.tHead.rows[0].cells, (th) => th.textContent.trim());
  for (const row of table.tBodies[0].rows) Array.from(row.cells).forEach((td, index) => { td.dataset.label = names[index] || ""; });
}

function clip(value, className = "clip") {
  if (value == null || value === "") return null;
  return el("span", { className, text: value, title: value });
}

function fact(list, term, value) {
  list.append(el("dt", { text: term }));
  const dd = el("dd");
  if (value == null || value === "") dd.append(el("span", { className: "none", text: "–" }));
  else if (value instanceof Node) dd.append(value);
  else dd.textContent = String(value);
  list.append(dd);
}

function countChip(label, count, tone) {
  return el("span", { className: "count tone-" + tone }, [el("strong", { text: count }), " " + label]);
}

// MARK: Sign-in

function showApp(signedIn) {
  $("#signin").hidden = signedIn;
  $("#app").hidden = !signedIn;
  $("#signout").hidden = !signedIn;
}

async function signIn(value) {
  sessionStorage.setItem("siwa-token", value);
  try {
    await api("/v1/notifications?limit=1");
  } catch (error) {
    sessionStorage.removeItem("siwa-token");
    $("#signin-error").textContent = error.status === 401 ? "That token is unknown, expired or revoked."
      : error.status === 403 ? "That token lacks the notifications:read scope." : error.message;
    return;
  }
  $("#signin-error").textContent = "";
  showApp(true);
  $("#who").textContent = "Signed in";
  await Promise.all([search(false), chart(), rejections(false), alerts(), transfers(), endpoint()]);
}

// MARK: Notifications

// Query strings are built with encodeURIComponent: URLSearchParams writes a space as "+", which
// servers need not read back as a space.
function queryString(pairs) {
  return pairs.map(([key, value]) => encodeURIComponent(key) + "=" + encodeURIComponent(value)).join("&");
}

function query() {
  const pairs = [];
  for (const [key, value] of new FormData($("#search")).entries()) if (String(value).trim() !== "") pairs.push([key, String(value).trim()]);
  pairs.push(["limit", "50"]);
  return pairs;
}

async function search(append) {
  const pairs = query();
  if (append && nextCursor) pairs.push(["cursor", nextCursor]);
  let page;
  try {
    page = await api("/v1/notifications?" + queryString(pairs));
  } catch (error) {
    $("#search-error").textContent = error.message;
    return;
  }
  $("#search-error").textContent = "";
  const body = $("#results tbody");
  if (!append) body.replaceChildren();
  for (const item of page.items) {
    const row = el("tr", { className: "clickable", attrs: { tabindex: "0", "data-jti": item.jti } });
    cell(row, time(item.received_at), "received"); cell(row, typeTag(item.type ?? item.raw_type), "type"); cell(row, badge(item.status), "status");
    cell(row, item.aud, "aud");
    cell(row, item.sub == null ? null : shortId(item.sub, { head: 10, tail: 5, onOpen: () => user(item.aud, item.sub) }), "sub");
    cell(row, time(item.event_time), "event"); cell(row, shortId(item.jti), "jti");
    cell(row, el("span", { className: "chevron", text: "›", attrs: { "aria-hidden": "true" } }), "go");
    row.addEventListener("click", () => detail(item.jti));
    row.addEventListener("keydown", (event) => { if (event.key === "Enter" && event.target === row) detail(item.jti); });
    body.appendChild(row);
  }
  nextCursor = page.next_cursor;
  $("#more").hidden = !nextCursor;
  const shown = body.rows.length;
  $("#results-count").textContent = shown + (nextCursor ? "+" : "") + (shown === 1 ? " notification" : " notifications");
  $("#results-empty").hidden = shown > 0;
}

// MARK: Notification detail

function openDialog(dialog) {
  if (!dialog.open) dialog.showModal();
  dialog.querySelector(".drawer-body").scrollTop = 0;
}

async function detail(jti) {
  const dialog = $("#detail");
  $("#detail-title").replaceChildren(shortId(jti, { head: 12, tail: 6 }));
  for (const id of ["#facts", "#callback", "#detail-badges"]) $(id).replaceChildren();
  for (const id of ["#jobs tbody", "#attempts tbody"]) $(id).replaceChildren();
  $("#detail-error").textContent = "";
  openDialog(dialog);
  let data;
  try {
    data = await api("/v1/notifications/" + encodeURIComponent(jti));
  } catch (error) {
    $("#detail-error").textContent = error.message;
    return;
  }
  $("#detail-badges").replaceChildren(...[typeTag(data.type ?? data.raw_type), badge(data.status), data.skip_reason ? clip(data.skip_reason, "muted") : null].filter(Boolean));

  const facts = $("#facts");
  const verification = data.verification || {};
  fact(facts, "aud", data.aud);
  fact(facts, "sub", data.sub == null ? null : shortId(data.sub, { head: 10, tail: 5, onOpen: () => user(data.aud, data.sub) }));
  // An app transfer re-keyed the user: what the token carried, beside the sub they have now.
  if (verification.sub && verification.sub !== data.sub) fact(facts, "sub as signed", shortId(verification.sub, { head: 10, tail: 5 }));
  fact(facts, "event type", data.raw_type && data.raw_type !== data.type ? data.type + " (sent as " + data.raw_type + ")" : data.type);
  fact(facts, "event time", time(data.event_time));
  fact(facts, "received", time(data.received_at));
  fact(facts, "deliveries", data.deliveries > 1 ? data.deliveries + " (last " + String(data.last_delivery_at).slice(0, 19).replace("T", " ") + ")" : data.deliveries);
  fact(facts, "kid", shortId(verification.kid, { head: 10, tail: 4 }));
  fact(facts, "alg", verification.alg);
  fact(facts, "iss", verification.iss);
  fact(facts, "issued (iat)", time(verification.iat));
  fact(facts, "expires (exp)", time(verification.exp));
  fact(facts, "jti from", verification.jti_derived ? "derived: SHA-256 of the payload (none was sent)" : "the token");
  fact(facts, "from address", verification.remote_addr);
  fact(facts, "email", data.email_withheld ? el("span", { className: "muted", text: "withheld (needs accounts:read)" }) : data.email);
  if (data.erased_at) fact(facts, "erased", time(data.erased_at));

  const jobs = data.jobs || [];
  const callbackJob = jobs.find((job) => job.lane === "callbacks");
  const callback = $("#callback");
  if (callbackJob) {
    fact(callback, "webhook-id", shortId(callbackJob.webhook_id, { head: 16, tail: 4 }));
    fact(callback, "URL", data.callback_url ? clip(data.callback_url, "clip url") : null);
    fact(callback, "state", badge(callbackJob.state));
    fact(callback, "last HTTP status", callbackJob.last_status);
    fact(callback, "attempts", callbackJob.attempt + " of " + callbackJob.max_attempts);
    fact(callback, "job id", callbackJob.id);
    if (callbackJob.last_error) fact(callback, "last error", clip(callbackJob.last_error));
  } else {
    callback.append(el("dd", { className: "muted wide", text: data.callback_url ? "No callback for this notification (none is sent until its effect is applied)." : "Callbacks are off on this server (SIWA_CALLBACK_URL is not set)." }));
  }

  const jobsBody = $("#jobs tbody");
  for (const job of jobs) {
    const row = el("tr");
    cell(row, laneTag(job.lane)); cell(row, job.id, "num"); cell(row, badge(job.state)); cell(row, job.attempt + " / " + job.max_attempts, "num");
    cell(row, job.last_status, "num"); cell(row, clip(job.last_error)); cell(row, time(job.created_at)); cell(row, time(job.finished_at));
    jobsBody.append(row);
  }
  labelCells($("#jobs"));

  const attempts = data.attempts || [];
  const attemptsBody = $("#attempts tbody");
  for (const attempt of attempts) {
    const row = el("tr", { attrs: { "data-lane": attempt.lane } });
    cell(row, laneTag(attempt.lane)); cell(row, attempt.attempt, "num"); cell(row, badge(attempt.outcome)); cell(row, attempt.http_status, "num");
    cell(row, time(attempt.started_at)); cell(row, duration(attempt.started_at, attempt.finished_at), "num");
    const revoked = attempt.revoked_sessions ? " (" + attempt.revoked_sessions + (attempt.revoked_sessions === 1 ? " session)" : " sessions)") : "";
    cell(row, attempt.effect == null ? null : attempt.effect + revoked); cell(row, clip(attempt.error));
    cell(row, shortId(attempt.worker, { head: 8, tail: 4 }));
    attemptsBody.append(row);
  }
  labelCells($("#attempts"));
  $("#attempts-count").replaceChildren(countChip(attempts.length === 1 ? "attempt" : "attempts", attempts.length, "neutral"));
  $("#attempts-empty").hidden = attempts.length > 0;
}

// MARK: User view

async function user(aud, sub) {
  $("#user-title").replaceChildren(shortId(sub, { head: 14, tail: 6 }));
  $("#user-aud").textContent = aud;
  for (const id of ["#sessions tbody", "#timeline tbody", "#sessions-count", "#timeline-count"]) $(id).replaceChildren();
  $("#sessions-note").textContent = "";
  $("#email-note").hidden = true;
  openDialog($("#user"));
  const path = "/v1/accounts/" + encodeURIComponent(aud) + "/" + encodeURIComponent(sub);
  await Promise.all([sessions(path), timeline(path)]);
}

// Sessions need the sessions:read scope; without it the timeline still shows.
async function sessions(path) {
  let data;
  try {
    data = await api(path + "/sessions?limit=100");
  } catch (error) {
    $("#sessions-note").textContent = error.status === 403 ? "This token lacks the sessions:read scope." : error.message;
    return;
  }
  const body = $("#sessions tbody");
  for (const item of data.items) {
    const state = item.active ? "active" : item.revoked_at ? "revoked" : "expired";
    const row = el("tr");
    cell(row, shortId(item.id, { head: 8, tail: 4 })); cell(row, badge(state)); cell(row, time(item.created_at)); cell(row, time(item.expires_at));
    cell(row, time(item.revoked_at)); cell(row, item.revoked_reason);
    body.append(row);
  }
  labelCells($("#sessions"));
  const active = data.items.filter((item) => item.active).length;
  $("#sessions-count").replaceChildren(countChip("active", active, "good"), countChip(data.next_cursor ? "shown" : "in all", data.items.length, "neutral"));
  if (!data.items.length) $("#sessions-note").textContent = "No sessions.";
}

async function timeline(path) {
  let data;
  try {
    data = await api(path + "/timeline");
  } catch (error) {
    $("#sessions-note").textContent = error.message;
    return;
  }
  const body = $("#timeline tbody");
  for (const item of data.items) {
    const row = el("tr", { className: "clickable", attrs: { tabindex: "0", "data-jti": item.jti } });
    cell(row, time(item.event_time)); cell(row, typeTag(item.type ?? item.raw_type)); cell(row, badge(item.status)); cell(row, item.effect);
    cell(row, item.revoked_sessions, "num");
    cell(row, item.email_withheld ? el("span", { className: "muted", text: "withheld" }) : item.email);
    cell(row, el("span", { className: "chevron", text: "›", attrs: { "aria-hidden": "true" } }), "go");
    row.addEventListener("click", () => detail(item.jti));
    row.addEventListener("keydown", (event) => { if (event.key === "Enter") detail(item.jti); });
    body.append(row);
  }
  labelCells($("#timeline"));
  $("#timeline-count").replaceChildren(countChip(data.items.length === 1 ? "notification" : "notifications", data.items.length, "neutral"));
  $("#email-note").hidden = !data.items.some((item) => item.email_withheld);
}

// MARK: Chart

async function chart() {
  const from = new Date(Math.floor(Date.now() / 3600000) * 3600000 - (7 * 24 - 1) * 3600000).toISOString();
  let data;
  try {
    data = await api("/v1/stats/notifications?bucket=hour&from=" + encodeURIComponent(from));
  } catch (error) {
    $("#chart-readout").textContent = error.message;
    return;
  }
  const hours = 7 * 24, start = Date.parse(from);
  const series = { revocations: new Array(hours).fill(0), email: new Array(hours).fill(0), other: new Array(hours).fill(0) };
  for (const bucket of data.items) {
    const index = Math.floor((Date.parse(bucket.start) - start) / 3600000);
    if (index < 0 || index >= hours) continue;
    for (const [type, count] of Object.entries(bucket.counts || {})) {
      const name = type === "consent-revoked" || type === "account-delete" ? "revocations" : type.startsWith("email-") ? "email" : "other";
      series[name][index] += Number(count) || 0;
    }
  }
  chartData = { start, hours, series };
  const sum = (values) => values.reduce((a, b) => a + b, 0);
  const revocations = sum(series.revocations), email = sum(series.email), other = sum(series.other);
  $("#chart-total").replaceChildren(
    countChip(revocations + email + other === 1 ? "notification" : "notifications", revocations + email + other, "neutral"),
    countChip(revocations === 1 ? "revocation" : "revocations", revocations, "revocations"), countChip(email === 1 ? "email change" : "email changes", email, "email"));
  drawChart();
}

/** A step of 1, 2 or 5 × 10^n that puts about four ticks on the axis. */
function niceStep(max) {
  const rough = Math.max(1, max / 4);
  const power = Math.pow(10, Math.floor(Math.log10(rough)));
  for (const factor of [1, 2, 5, 10]) if (factor * power >= rough) return factor * power;
  return 10 * power;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(svgNS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text != null) node.textContent = String(text);
  return node;
}

function hourLabel(ms) { return new Date(ms).toISOString().slice(0, 16).replace("T", " ") + " UTC"; }

const readoutHint = "Point at a bar for its hour and counts.";

function drawChart() {
  if (!chartData) return;
  const { start, hours, series } = chartData;
  const container = $("#chart");
  const width = Math.max(280, container.clientWidth || 800), height = 220;
  const left = 44, right = 12, top = 12, bottom = 42;
  const plotWidth = width - left - right, plotHeight = height - top - bottom;
  const totals = series.revocations.map((value, index) => value + series.email[index] + series.other[index]);
  const step = niceStep(Math.max(...totals, 1));
  const max = Math.max(step, Math.ceil(Math.max(...totals, 1) / step) * step);
  const y = (value) => top + plotHeight - (value / max) * plotHeight;
  const slot = plotWidth / hours;
  const root = svg("svg", { viewBox: "0 0 " + width + " " + height, width, height, class: "chart" });
  root.addEventListener("mouseleave", () => { $("#chart-readout").textContent = readoutHint; });

  // Y axis: grid lines with their values, and what is counted.
  for (let value = 0; value <= max; value += step) {
    root.append(svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: value === 0 ? "axis" : "grid" }));
    root.append(svg("text", { x: left - 6, y: y(value) + 4, class: "tick", "text-anchor": "end" }, value));
  }
  root.append(svg("text", { x: 12, y: top + plotHeight / 2, class: "axis-title", "text-anchor": "middle", transform: "rotate(-90 12 " + (top + plotHeight / 2) + ")" }, "per hour"));

  // X axis: a tick at each UTC midnight, labelled with the date.
  const firstMidnight = Math.ceil(start / 86400000) * 86400000;
  const labelEvery = 24 * slot < 46 ? 2 : 1;  // every other date when a day is too narrow for its label
  for (let day = firstMidnight, index = 0; day < start + hours * 3600000; day += 86400000, index++) {
    const x = left + ((day - start) / 3600000) * slot;
    root.append(svg("line", { x1: x, x2: x, y1: top, y2: top + plotHeight + 4, class: "grid day" }));
    if (index % labelEvery) continue;
    const label = new Date(day).toLocaleDateString("en", { month: "short", day: "numeric", timeZone: "UTC" });
    root.append(svg("text", { x, y: top + plotHeight + 17, class: "tick", "text-anchor": "middle" }, label));
  }
  root.append(svg("text", { x: left + plotWidth / 2, y: height - 4, class: "axis-title", "text-anchor": "middle" }, "day (UTC), one bar per hour"));

  // Bars, stacked: revocations at the bottom, then email, then anything else.
  const barWidth = Math.max(1, slot - (slot > 4 ? 1 : 0));
  for (let index = 0; index < hours; index++) {
    const x = left + index * slot;
    let base = 0;
    for (const name of ["revocations", "email", "other"]) {
      const count = series[name][index];
      if (!count) continue;
      root.append(svg("rect", { x, y: y(base + count), width: barWidth, height: Math.max(1, y(base) - y(base + count)), class: "bar " + name }));
      base += count;
    }
    // A full-height target per hour: its title is the tooltip; pointing at it fills the readout.
    const text = hourLabel(start + index * 3600000) + ": " + totals[index] + " (" + series.revocations[index] + " revocations, " + series.email[index] + " email"
      + (series.other[index] ? ", " + series.other[index] + " other" : "") + ")";
    const target = svg("rect", { x, y: top, width: slot, height: plotHeight, class: "hover", "data-hour": index });
    target.append(svg("title", {}, text));
    target.addEventListener("mouseenter", () => { $("#chart-readout").textContent = text; });
    root.append(target);
  }
  container.replaceChildren(root);
}

// MARK: Rejections and alerts

let rejectionsCursor = null;

/** A message cut to its cell's width that a tap (or Enter) shows whole: a phone has no hover. */
function expandable(value, className) {
  const node = clip(value, className);
  if (!node) return node;
  node.tabIndex = 0;
  node.setAttribute("role", "button");
  node.setAttribute("aria-expanded", "false");
  const toggle = () => node.setAttribute("aria-expanded", String(node.classList.toggle("expanded")));
  node.addEventListener("click", toggle);
  node.addEventListener("keydown", (event) => { if (event.key === "Enter" || event.key === " ") { event.preventDefault(); toggle(); } });
  return node;
}

// The newest rejections, 20 at a time ("More" for the next), with the counts of the last 24 h.
async function rejections(append) {
  let data;
  try {
    data = await api("/v1/rejections?limit=20" + (append && rejectionsCursor ? "&cursor=" + encodeURIComponent(rejectionsCursor) : ""));
  } catch (error) {
    $("#rejections-since").textContent = error.message;
    return;
  }
  const body = $("#rejections tbody");
  if (!append) body.replaceChildren();
  for (const item of data.items) {
    const row = el("tr");
    cell(row, time(item.received_at)); cell(row, el("span", { className: "badge tone-warn", text: item.reason })); cell(row, expandable(item.message, "clip message"));
    cell(row, item.remote_addr);
    body.appendChild(row);
  }
  labelCells($("#rejections"));
  rejectionsCursor = data.next_cursor;
  $("#rejections-more").hidden = !data.next_cursor;
  $("#rejections-empty").hidden = body.children.length > 0;
  const totals = (data.totals || []).map((total) => ({ reason: total.reason, count: (total.recorded || 0) + (total.sampled_out || 0) }))
    .sort((a, b) => b.count - a.count);
  const all = totals.reduce((sum, total) => sum + total.count, 0);
  const hours = Math.round((Date.now() - Date.parse(data.totals_since)) / 3600000);
  $("#rejections-since").textContent = all + (Number.isFinite(hours) ? " in the last " + hours + " h" : "") + "; " + body.children.length + " shown";
  $("#rejection-counts").replaceChildren(...totals.map((total) => el("li", {}, [countChip(total.reason, total.count, "warn")])));
}

/** "1 alert", "2 alerts". */
function plural(count, noun) { return count + " " + noun + (count === 1 ? "" : "s"); }

// Trouble first: firing alerts, an endpoint that is not healthy and discarded Apple revocations,
// at the top of the page on every width, each a link to its card. Filled as the cards load.
const trouble = { alerts: [], endpoint: null, discarded: 0, suppressions: [] };

function renderTrouble() {
  const lines = [];
  if (trouble.alerts.length) {
    const kinds = [...new Set(trouble.alerts.map((item) => item.kind + (item.aud ? " (" + item.aud + ")" : "")))].join(", ");
    lines.push(["#alerts-title", plural(trouble.alerts.length, "alert") + " firing: " + kinds]);
  }
  if (trouble.endpoint) {
    lines.push(["#endpoint-title", "The endpoint Apple posts to is " + trouble.endpoint.status + (trouble.endpoint.cause ? ": " + trouble.endpoint.cause : "")]);
  }
  for (const lane of trouble.suppressions) {
    lines.push(["#suppressions-title", "Mail provider " + lane.target + ": " + (lane.discarded ? plural(lane.discarded, "dead letter") : plural(lane.retrying, "operation") + " retrying")
      + (lane.last_error ? " (" + lane.last_error + ")" : "")]);
  }
  if (trouble.discarded) {
    lines.push(["#alerts-title", plural(trouble.discarded, "Apple token revocation") + " discarded: " + (trouble.discarded === 1 ? "its token stays" : "their tokens stay") + " unrevoked"]);
  }
  $("#trouble").hidden = lines.length === 0;
  $("#trouble-items").replaceChildren(...lines.map(([target, text]) => el("li", {}, [el("a", { text, attrs: { href: target } })])));
}

// Alerts need the alerts:read scope; a token without it still sees everything else.
async function alerts() {
  const body = $("#alerts tbody");
  body.replaceChildren();
  let data;
  try {
    data = await api("/v1/alerts?limit=20");
  } catch (error) {
    $("#alerts-note").textContent = error.status === 403 ? "This token lacks the alerts:read scope." : error.message;
    $("#alerts-counts").replaceChildren();
    trouble.alerts = [];
    renderTrouble();
    return;
  }
  const items = data.items.filter((item) => item.kind !== "test")
    .sort((a, b) => (a.state === b.state ? 0 : a.state === "firing" ? -1 : 1));
  const firing = items.filter((item) => item.state === "firing").length;
  trouble.alerts = items.filter((item) => item.state === "firing" && !item.silenced);
  renderTrouble();
  $("#alerts-counts").replaceChildren(countChip("firing", firing, firing ? "bad" : "good"), countChip("resolved", items.length - firing, "neutral"));
  $("#alerts-note").textContent = firing ? "Firing now." : items.length ? "Nothing firing." : "No alerts yet.";
  for (const item of items) {
    const row = el("tr", { className: item.state === "firing" ? "firing" : "resolved" });
    const state = el("span", { className: "badges" }, [badge(item.state === "firing" ? "firing" : "resolved"), item.silenced ? badge("silenced") : null]);
    cell(row, state); cell(row, item.kind); cell(row, item.aud); cell(row, item.series?.length ? item.series.join(", ") : null);
    cell(row, item.count, "num"); cell(row, item.baseline, "num"); cell(row, time(item.started_at)); cell(row, time(item.resolved_at));
    body.appendChild(row);
  }
  labelCells($("#alerts"));
}

// App transfers need the accounts:read scope: without it the card says so; with it, it shows when
// there are transfers to show.
async function transfers() {
  let data;
  const body = $("#transfers tbody");
  body.replaceChildren();
  try {
    data = await api("/v1/transfers");
  } catch (error) {
    $("#transfers-card").hidden = false;
    $("#transfers-note").hidden = false;
    $("#transfers-note").textContent = error.status === 403
      ? "This token lacks the accounts:read scope: make one with siwa-events tokens create --scope notifications:read --scope accounts:read."
      : error.message;
    return;
  }
  $("#transfers-note").hidden = true;
  $("#transfers-card").hidden = data.items.length === 0;
  let urgent = 0;
  for (const item of data.items) {
    const refused = Object.values(item.refused || {}).reduce((sum, count) => sum + count, 0);
    // Days left: red in the last 3 with users left, amber within 14, grey once closed.
    const tone = !item.window_open ? "muted" : item.users_left === 0 ? "good" : item.days_left <= 3 ? "bad" : item.days_left <= 14 ? "warn" : "info";
    if (item.window_open && item.users_left > 0 && item.days_left <= 14) urgent += 1;
    const closing = el("span", {
      className: "badge tone-" + tone, title: "closes " + item.window_closes_at,
      text: item.window_open ? item.days_left + " days left" : "closed",
    });
    const row = el("tr", { className: tone === "bad" ? "firing" : "" });
    cell(row, item.client_id);
    cell(row, (item.direction === "outgoing" ? "to " : "from ") + item.team_id);
    cell(row, time(item.transferred_at)); cell(row, closing);
    cell(row, item.users, "num"); cell(row, item.done, "num"); cell(row, refused, "num"); cell(row, item.users_left, "num");
    body.appendChild(row);
  }
  $("#transfers-counts").replaceChildren(
    countChip("open", data.items.filter((item) => item.window_open).length, "neutral"), countChip("closing with users left", urgent, urgent ? "bad" : "good"));
  labelCells($("#transfers"));
}

// Revocations of kept Apple tokens that Apple has not taken (admin /health): shown while any
// wait; discarded ones keep their tokens unrevoked until an operator retries them.
function revocations(backlog) {
  const note = $("#revocations-note");
  note.hidden = !backlog || backlog.waiting + backlog.discarded === 0;
  if (note.hidden) return;
  const parts = ["Apple token revocations: ", countChip("waiting", backlog.waiting, backlog.waiting ? "warn" : "good"), " ",
    countChip("discarded", backlog.discarded, backlog.discarded ? "bad" : "good")];
  if (backlog.discarded) parts.push(" — their tokens stay unrevoked: see siwa-events apple revocations --failed, then siwa-events apple retry --discarded");
  note.replaceChildren(...parts);
}

// Each configured mail provider's lane (admin /health): failing ones go to "Needs attention".
function suppressions(lanes) {
  $("#suppressions-card").hidden = !lanes || lanes.length === 0;
  trouble.suppressions = (lanes || []).filter((lane) => lane.discarded > 0 || lane.retrying > 0);
  if (!lanes || lanes.length === 0) return;
  const body = $("#suppressions tbody");
  body.replaceChildren();
  for (const lane of lanes) {
    const row = el("tr", { className: lane.discarded || lane.retrying ? "firing" : "" });
    cell(row, lane.target); cell(row, lane.pending, "num"); cell(row, lane.retrying, "num"); cell(row, lane.discarded, "num");
    cell(row, lane.last_success ? time(lane.last_success) : "never"); cell(row, lane.last_error);
    body.appendChild(row);
  }
  const failing = trouble.suppressions.length;
  $("#suppressions-counts").replaceChildren(countChip("failing", failing, failing ? "bad" : "good"));
  labelCells($("#suppressions"));
}

// The endpoint registered with Apple (admin /health, no scope needed): shown when SIWA_PUBLIC_URL
// is set. The findings quote what the endpoint answered: text only, like everything else.
async function endpoint() {
  let data;
  try {
    data = await api("/health");
  } catch (error) {
    $("#endpoint-card").hidden = true;
    return;
  }
  revocations(data.apple_revocations);
  suppressions(data.suppressions);
  const result = data.endpoint;
  trouble.discarded = data.apple_revocations?.discarded || 0;
  trouble.endpoint = result?.status === "unhealthy" ? result : null;
  renderTrouble();
  $("#endpoint-card").hidden = result == null;
  if (result == null) return;
  const tone = result.status === "healthy" ? "good" : result.status === "unhealthy" ? "bad" : "neutral";
  $("#endpoint-status").replaceChildren(el("span", { className: "badge tone-" + tone, text: result.status }),
    result.cause ? el("span", { className: "muted", text: " " + result.cause }) : null);
  const days = result.certificate_days_left;
  const facts = [["URL", result.url], ["checked (UTC)", time(result.checked_at)],
    ["certificate", result.certificate_expires_at ? el("span", {}, [time(result.certificate_expires_at), " (" + days + (days === 1 ? " day left)" : " days left)")]) : null]];
  $("#endpoint-facts").replaceChildren(...facts.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", {}, [value ?? el("span", { className: "none", text: "–" })])]));
  const levelTones = { ok: "good", warn: "warn", fail: "bad" };
  $("#endpoint-checks").replaceChildren(...(result.checks || []).map((finding) => el("li", { className: "level-" + finding.level }, [
    el("span", { className: "badge tone-" + (levelTones[finding.level] || "neutral"), text: finding.level }), " ",
    el("strong", { text: finding.check }), " ", el("span", { text: finding.detail })])));
}

document.addEventListener("DOMContentLoaded", () => {
  $("#signin-form").addEventListener("submit", (event) => { event.preventDefault(); signIn($("#token").value.trim()); });
  $("#search").addEventListener("submit", (event) => { event.preventDefault(); search(false); });
  $("#more").addEventListener("click", () => search(true));
  $("#rejections-more").addEventListener("click", () => rejections(true));
  $("#signout").addEventListener("click", () => { sessionStorage.removeItem("siwa-token"); showApp(false); $("#who").textContent = ""; });
  for (const dialog of document.querySelectorAll("dialog")) {
    dialog.querySelector("[data-close]").addEventListener("click", () => dialog.close());
    // A click on the backdrop (outside the panel) closes it too.
    dialog.addEventListener("click", (event) => { if (event.target === dialog) dialog.close(); });
  }
  // The chart is drawn to its box's width: again whenever that width changes.
  let drawnWidth = 0;
  new ResizeObserver(() => {
    const width = $("#chart").clientWidth;
    if (width && width !== drawnWidth) { drawnWidth = width; drawChart(); }
  }).observe($("#chart"));
  if (token()) signIn(token()); else showApp(false);
});
