// siwa-events dashboard. Every value from the API is attacker-influenced (notification fields,
// rejected bodies): it only ever reaches the page through textContent / setAttribute, never as
// markup. The token lives in sessionStorage and travels only in the Authorization header.
"use strict";

const $ = (selector) => document.querySelector(selector);
let nextCursor = null;

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

function cell(row, value) {
  const td = document.createElement("td");
  td.textContent = value == null ? "–" : String(value);
  row.appendChild(td);
  return td;
}

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
  $("#who").textContent = "signed in";
  await Promise.all([search(false), chart(), rejections(), alerts()]);
}

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
    const row = document.createElement("tr");
    cell(row, item.received_at); cell(row, item.type); cell(row, item.status); cell(row, item.aud);
    const subCell = cell(row, "");
    if (item.sub != null) {
      const link = document.createElement("button");
      link.type = "button";
      link.className = "link";
      link.textContent = item.sub;
      link.addEventListener("click", () => timeline(item.aud, item.sub));
      subCell.replaceChildren(link);
    }
    cell(row, item.event_time); cell(row, item.jti);
    body.appendChild(row);
  }
  nextCursor = page.next_cursor;
  $("#more").hidden = !nextCursor;
}

async function timeline(aud, sub) {
  const data = await api("/v1/accounts/" + encodeURIComponent(aud) + "/" + encodeURIComponent(sub) + "/timeline");
  $("#timeline-hint").textContent = "Timeline of " + sub + " (" + aud + ")";
  const body = $("#timeline tbody");
  body.replaceChildren();
  for (const item of data.items) {
    const row = document.createElement("tr");
    cell(row, item.event_time); cell(row, item.type); cell(row, item.status); cell(row, item.effect); cell(row, item.revoked_sessions);
    cell(row, item.email_withheld ? "withheld" : item.email);
    body.appendChild(row);
  }
  $("#email-note").hidden = !data.items.some((item) => item.email_withheld);
}

async function chart() {
  const from = new Date(Date.now() - 7 * 86400 * 1000).toISOString();
  const data = await api("/v1/stats/notifications?bucket=hour&from=" + encodeURIComponent(from));
  const svgNS = "http://www.w3.org/2000/svg";
  const hours = 7 * 24, width = 840, height = 150;
  const start = Date.parse(from);
  const series = { revocations: new Array(hours).fill(0), email: new Array(hours).fill(0) };
  for (const bucket of data.items) {
    const index = Math.floor((Date.parse(bucket.start) - start) / 3600000);
    if (index < 0 || index >= hours) continue;
    const counts = bucket.counts || {};
    series.revocations[index] += (counts["consent-revoked"] || 0) + (counts["account-delete"] || 0);
    series.email[index] += (counts["email-disabled"] || 0) + (counts["email-enabled"] || 0);
  }
  const max = Math.max(1, ...series.revocations, ...series.email);
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  const barWidth = width / hours / 2;
  ["revocations", "email"].forEach((name, offset) => {
    series[name].forEach((count, index) => {
      if (count === 0) return;
      const rect = document.createElementNS(svgNS, "rect");
      const barHeight = Math.max(1, (count / max) * (height - 10));
      rect.setAttribute("x", String(index * barWidth * 2 + offset * barWidth));
      rect.setAttribute("y", String(height - barHeight));
      rect.setAttribute("width", String(barWidth));
      rect.setAttribute("height", String(barHeight));
      rect.setAttribute("class", name);
      const title = document.createElementNS(svgNS, "title");
      title.textContent = count + " at " + new Date(start + index * 3600000).toISOString();
      rect.appendChild(title);
      svg.appendChild(rect);
    });
  });
  $("#chart").replaceChildren(svg);
}

async function rejections() {
  const data = await api("/v1/rejections?limit=20");
  const body = $("#rejections tbody");
  body.replaceChildren();
  for (const item of data.items) {
    const row = document.createElement("tr");
    cell(row, item.received_at); cell(row, item.reason); cell(row, item.message); cell(row, item.remote_addr);
    body.appendChild(row);
  }
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
    return;
  }
  const items = data.items.filter((item) => item.kind !== "test")
    .sort((a, b) => (a.state === b.state ? 0 : a.state === "firing" ? -1 : 1));
  $("#alerts-note").textContent = items.some((item) => item.state === "firing") ? "Firing now." : items.length ? "Nothing firing." : "No alerts yet.";
  for (const item of items) {
    const row = document.createElement("tr");
    row.className = item.state;
    cell(row, item.state + (item.silenced ? " (silenced)" : "")); cell(row, item.kind); cell(row, item.aud); cell(row, item.series?.length ? item.series.join(", ") : null);
    cell(row, item.count); cell(row, item.baseline); cell(row, item.started_at); cell(row, item.resolved_at);
    body.appendChild(row);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("#signin-form").addEventListener("submit", (event) => { event.preventDefault(); signIn($("#token").value.trim()); });
  $("#search").addEventListener("submit", (event) => { event.preventDefault(); search(false); });
  $("#more").addEventListener("click", () => search(true));
  $("#signout").addEventListener("click", () => { sessionStorage.removeItem("siwa-token"); showApp(false); $("#who").textContent = ""; });
  if (token()) signIn(token()); else showApp(false);
});
