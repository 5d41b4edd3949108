// ragwatch live page: plain JS, no build step, uPlot vendored in static/vendor/.
//
// Every string from the API goes into the DOM as text (textContent / append(string)),
// never as HTML: labels, process names and hints come from the monitored fleet.
// Auth: open the page once as /?token=<RAGWATCH_SERVE_TOKEN>; the token is kept in
// sessionStorage (this tab only), removed from the address bar, and sent as
// "Authorization: Bearer" on every API call.
//
// Two pages run this script: the live page (/) and an alert's page (/alerts/<fingerprint>,
// where notifications link to: <body data-page="alert" data-root="../">). The charts are
// chart.js's. Every time shown is in UTC, and says so.
(function () {
  "use strict";

  const REFRESH_MS = 5000;
  const INDEX_REFRESH_MS = 30000;
  const TOKEN_KEY = "ragwatch.token";
  const GB = 1e9;
  const PAGE = document.body.dataset.page || "live";
  const ROOT = document.body.dataset.root || "";  // the API is at ROOT + "api/v1/..."

  // ------------------------------------------------------------------ token and API

  (function takeToken() {
    const params = new URLSearchParams(window.location.search);
    if (!params.has("token")) return;
    window.sessionStorage.setItem(TOKEN_KEY, params.get("token"));
    params.delete("token");
    const query = params.toString();
    window.history.replaceState(
      null, "", window.location.pathname + (query ? "?" + query : "") + window.location.hash);
  })();

  async function api(path) {
    const headers = { Accept: "application/json" };
    const token = window.sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const resp = await fetch(ROOT + path, { headers: headers, cache: "no-store" });
    if (resp.status === 401) {
      throw new Error("unauthorized: open this page once as " + window.location.pathname +
        "?token=<RAGWATCH_SERVE_TOKEN>");
    }
    if (!resp.ok) {
      let reason = "";
      try { reason = (await resp.json()).error || ""; } catch (e) { /* not JSON */ }
      const err = new Error(path + ": HTTP " + resp.status + (reason ? " " + reason : ""));
      err.status = resp.status;
      throw err;
    }
    return resp.json();
  }

  // ------------------------------------------------------------------ DOM helpers

  const $ = (id) => document.getElementById(id);

  // el("li", {class: "x"}, "text", child): strings become text nodes, never HTML.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const num = window.ragwatchChart.num;  // a finite number, else null
  function number(v) {
    const n = num(v);
    return n === null ? "-" : String(Number(n.toPrecision(4)));
  }
  function fmt(v, digits, suffix) {
    const n = num(v);
    return n === null ? "-" : n.toFixed(digits) + (suffix || "");
  }
  function signed(v, digits) {
    const n = num(v);
    return n === null ? "-" : (n >= 0 ? "+" : "") + n.toFixed(digits);
  }
  const when = window.ragwatchChart.utc;  // "2026-12-02 14:05 UTC"
  function clock(ms) {  // "14:05:09 UTC"
    return new Date(ms).toISOString().slice(11, 19) + " UTC";
  }
  function hours(v) {
    const n = num(v);
    if (n === null) return "-";
    return n >= 48 ? (n / 24).toFixed(1) + " d" : n.toFixed(1) + " h";
  }
  function gpuName(g) { return String(g.index) + (g.mig ? "/" + g.mig : ""); }

  const LABEL_ORDER = ["host", "gpu", "mig", "pid", "process", "container", "service", "instance"];
  const HIDDEN = ["alertname", "severity", "uuid"];
  function labelText(labels) {
    const keys = Object.keys(labels || {});
    const first = LABEL_ORDER.filter((k) => keys.includes(k));
    const rest = keys.filter((k) => !LABEL_ORDER.includes(k) && !HIDDEN.includes(k)).sort();
    return first.concat(rest)
      .filter((k) => labels[k] !== "" && labels[k] !== null)
      .map((k) => k + "=" + labels[k]).join(" ");
  }

  // ------------------------------------------------------------------ sections

  // The most urgent first: severity (critical, error, warning, info), then firing before
  // pending, then the newest.
  const SEVERITY = ["critical", "error", "warning", "info"];
  function rank(list, v) {
    const i = list.indexOf(v);
    return i < 0 ? list.length : i;
  }
  function byUrgency(a, b) {
    return rank(SEVERITY, a.severity) - rank(SEVERITY, b.severity) ||
      rank(["firing", "pending"], a.status) - rank(["firing", "pending"], b.status) ||
      (num(b.starts_at) || 0) - (num(a.starts_at) || 0) ||
      String(a.fingerprint).localeCompare(String(b.fingerprint));
  }

  function renderAlerts(alerts) {
    const firing = alerts.filter((a) => a.status === "firing").length;
    $("alert-counts").textContent = "(" + firing + " firing, " + (alerts.length - firing) + " pending)";
    const items = alerts.map((a) => {
      const ann = a.annotations || {};
      return el("li", { class: "alert " + (a.status === "firing" ? "firing" : "pending"),
                        "data-alertname": a.rule, "data-fingerprint": a.fingerprint,
                        "data-severity": a.severity, "data-status": a.status },
        el("span", { class: "state" }, a.status),
        el("span", { class: "rule" }, a.rule),
        el("span", { class: "severity muted" }, a.severity + " "),
        el("span", { class: "labels" }, labelText(a.labels)),
        el("span", { class: "muted" }, "  since " + when(a.starts_at)),
        el("a", { href: "alerts/" + encodeURIComponent(a.fingerprint) }, "details"),
        ann.summary ? el("p", { class: "summary" }, ann.summary) : null,
        ann.hint ? el("p", { class: "hint" }, "hint: " + ann.hint) : null);
    });
    if (!items.length) items.push(el("li", { class: "muted" }, "no active alerts"));
    $("alerts").replaceChildren(...items);
  }

  function memoryBar(used, total) {
    const ratio = num(used) !== null && num(total) ? Math.min(1, Math.max(0, used / total)) : 0;
    const fill = el("div", { class: "fill" + (ratio >= 0.95 ? " full" : ratio >= 0.85 ? " high" : "") });
    fill.style.width = (ratio * 100).toFixed(1) + "%";
    return el("div", { class: "bar", title: (ratio * 100).toFixed(0) + "% used" }, fill);
  }

  function renderGpu(g) {
    const procs = (g.procs || []).slice().sort((a, b) => (num(b.gb_per_hour) || 0) - (num(a.gb_per_hour) || 0));
    const top = procs[0];
    const growth = num(g.gb_per_hour);
    return el("div", { class: "gpu" },
      el("span", null, "GPU " + gpuName(g)),
      memoryBar(g.fb_used_bytes, g.fb_total_bytes),
      el("span", null, fmt(num(g.fb_used_bytes) === null ? null : g.fb_used_bytes / GB, 1) + " / " +
        fmt(num(g.fb_total_bytes) === null ? null : g.fb_total_bytes / GB, 1) + " GB"),
      el("span", { class: "detail" },
        el("span", { class: growth !== null && growth > 0.5 ? "growing" : "" }, signed(growth, 2) + " GB/h"),
        " · OOM in " + hours(g.tte_h) + " · util " + fmt(g.gpu_util, 0, "%") +
        (g.name ? " · " + g.name : "") +
        (top ? " · top: " + top.name + " pid " + top.pid + " (" + signed(top.gb_per_hour, 2) + " GB/h)" : "")));
  }

  function renderHosts(hosts) {
    const cards = hosts.map((h) => {
      const engines = (h.engines || []).map((e) => {
        const s = e.signals || {};
        return el("div", { class: "muted" }, "engine " + e.target + ": " +
          fmt(s.generation_tokens_per_s, 0) + " tok/s (forecast " + fmt(s.tps_forecast, 0) +
          "), waiting " + fmt(s.requests_waiting, 0));
      });
      const gpus = (h.gpus || []).map(renderGpu);
      if (!gpus.length) gpus.push(el("div", { class: "muted" }, "no GPUs reported"));
      return el("div", { class: "host", "data-host": h.host }, el("h3", null, h.host), ...gpus, ...engines);
    });
    if (!cards.length) cards.push(el("p", { class: "muted" }, "no hosts reported yet"));
    $("hosts").replaceChildren(...cards);
  }

  function vs(value, forecast) {
    const v = num(value), f = num(forecast);
    if (v === null) return "-";
    if (!f) return v.toFixed(0);
    return v.toFixed(0) + " / " + f.toFixed(0) + " (" + signed((v / f - 1) * 100, 0) + "%)";
  }

  function stageText(s) {
    const stages = new Set();
    for (const key of Object.keys(s)) {
      const m = /^([a-z0-9_]+?)_p(95|99)_ms$/.exec(key);
      if (m && !["e2e", "ttft", "queue"].includes(m[1])) stages.add(m[1]);
    }
    return Array.from(stages)
      .map((st) => st + " " + fmt(s[st + "_p95_ms"], 0) + "/" + fmt(s[st + "_p99_ms"], 0)).join("  ");
  }

  function renderServices(services) {
    const rows = [];
    for (const svc of services) {
      for (const inst of svc.instances || []) {
        const s = inst.signals || {};
        const tpr = num(s.tokens_per_request), fc = num(s.tpr_forecast);
        rows.push(el("tr", null,
          el("td", null, svc.service), el("td", null, inst.instance), el("td", null, inst.host || "-"),
          el("td", null, fmt(s.rps, 1)),
          el("td", { class: tpr !== null && fc && tpr / fc - 1 < -0.25 ? "bad" : "" }, vs(tpr, fc)),
          el("td", null, vs(s.output_tokens_per_s, s.tps_forecast)),
          el("td", null, stageText(s) || "-"),
          el("td", null, fmt(s.e2e_p95_ms, 0) + " / " + fmt(s.e2e_p99_ms, 0)),
          el("td", null, fmt(s.queue_p95_ms, 0, " ms")),
          el("td", { class: num(s.errors_ratio) ? "bad" : "" }, fmt(num(s.errors_ratio) === null ? null : s.errors_ratio * 100, 1, "%"))));
      }
    }
    if (!rows.length) rows.push(el("tr", null, el("td", { colspan: 10, class: "muted" }, "no services reported yet")));
    $("services").tBodies[0].replaceChildren(...rows);
  }

  function renderSilences(silences, notifier) {
    const items = silences.map((s) => el("li", null,
      el("strong", null, s.state + " "),
      (s.matchers || []).map((m) => m.name + m.op + m.value).join(" "),
      s.cron ? " · cron " + s.cron : " · until " + when(s.ends_at),
      " · " + (s.author || "?") + ": " + (s.comment || "")));
    if (!items.length) items.push(el("li", { class: "muted" }, "no silences"));
    $("silences").replaceChildren(...items);
    const n = notifier || {};
    $("notifier").textContent = "notifier: " + (n.outbox_pending || 0) + " due in the outbox, " +
      (n.dead_letters || 0) + " dead letters" +
      (num(n.seen) !== null ? ", last seen " + clock(n.seen * 1000) : ", never reported");
  }

  // ------------------------------------------------------------------ series chart

  let selected = null;       // series id shown
  let picked = false;        // chosen by the user (the list or #series=): kept
  let indexLoadedAt = 0;
  let indexIds = new Set();
  let charts = [];
  let drawn = "";            // what the charts show: series id and which lines
  const details = new Map(); // fingerprint -> /api/v1/alerts/{fp} of the alerts on top

  // The alerts on top, read again when their status changes: which series chart each
  // one (the server says: the signal its rule is about, ragwatch/chart_ids.py) and its
  // transitions (the markers).
  async function readDetails(alerts) {
    const top = alerts.slice(0, 5);
    for (const a of top) {
      const known = details.get(a.fingerprint);
      if (known && known.alert.status === a.status) continue;
      try {
        details.set(a.fingerprint, await api("api/v1/alerts/" + encodeURIComponent(a.fingerprint)));
      } catch (err) {
        if (err.status !== 404) throw err;  // 404: it resolved since
      }
    }
    const keep = new Set(top.map((a) => a.fingerprint));
    for (const fp of Array.from(details.keys())) if (!keep.has(fp)) details.delete(fp);
  }

  // The chart of the most urgent alert that has one.
  function seriesForAlerts(alerts) {
    for (const a of alerts) {
      const found = details.get(a.fingerprint);
      if (found && found.series.length) return found.series[0];
    }
    return null;
  }

  // Each state change of the alerts this series charts (sid null: of every alert in
  // ``founds``): [{status, ts}], oldest first.
  function markersFor(sid, founds) {
    const out = [];
    for (const found of founds) {
      if (sid !== null && !(found.series || []).includes(sid)) continue;
      for (const h of found.history || []) {
        const ts = num(h.at) === null ? (h.status === "resolved" ? h.ends_at : h.starts_at) : h.at;
        if (num(ts) !== null) out.push({ status: h.status, ts: ts, fingerprint: h.fingerprint });
      }
    }
    return out.sort((a, b) => a.ts - b.ts);
  }

  async function loadIndex() {
    const index = await api("api/v1/series?limit=5000");
    const groups = {};
    for (const s of index.series) (groups[s.kind] = groups[s.kind] || []).push(s);
    const options = Object.keys(groups).sort().map((kind) => el("optgroup", { label: kind },
      ...groups[kind].map((s) => el("option", { value: s.id }, s.id))));
    $("series-select").replaceChildren(...options);
    indexIds = new Set(index.series.map((s) => s.id));
    indexLoadedAt = Date.now();
    return index;
  }

  async function chooseSeries(alerts) {
    const first = !indexLoadedAt;
    const index = Date.now() - indexLoadedAt > INDEX_REFRESH_MS ? await loadIndex() : null;
    if (first && indexIds.has(seriesInHash())) {
      selected = seriesInHash();
      picked = true;
    }
    if (!picked || !indexIds.has(selected)) {
      picked = false;
      const fromAlert = seriesForAlerts(alerts);
      const any = index ? (index.series[0] || {}).id : selected;
      selected = fromAlert || (indexIds.has(selected) ? selected : any) || null;
    }
    const select = $("series-select");
    if (selected && !indexIds.has(selected)) select.append(el("option", { value: selected }, selected));
    if (selected) select.value = selected;
  }

  function seriesInHash() {
    return decodeURIComponent((window.location.hash.match(/^#series=(.*)$/) || [])[1] || "");
  }

  function chartWidth() { return Math.max(320, $("series-section").clientWidth - 20); }

  function drawSeries(s, gpu, marks) {
    const m = window.ragwatchChart.model(s, gpu, marks);
    const shape = [s.id, m.lines.map((l) => l.opts.label).join(","), !!m.score].join("|");
    if (shape === drawn && charts.length) {
      // same series and lines: new data into the same charts (no flicker)
      window.ragwatchChart.update(charts, [$("chart"), $("score-chart")], m);
    } else {
      for (const c of charts) c.destroy();
      $("chart").replaceChildren();
      $("score-chart").replaceChildren();
      charts = [window.ragwatchChart.valueChart($("chart"), chartWidth(), m)];
      if (m.score) charts.push(window.ragwatchChart.scoreChart($("score-chart"), chartWidth(), m));
      drawn = shape;
    }
    const ts = s.points.map((p) => p[0]);
    $("chart").dataset.points = String(ts.length);
    $("chart").dataset.series = s.id;
    $("score-chart").dataset.points = String(m.score ? ts.length : 0);
    const box = $("chart").getBoundingClientRect();
    $("chart").dataset.bottom = String(Math.round(box.bottom + window.scrollY));
    $("series-meta").textContent = s.kind + " · " + labelText(s.labels || {}) + " · " +
      ts.length + " points" + (ts.length ? ", " + when(ts[0]) + " to " + when(ts[ts.length - 1]) : "");
  }

  async function loadSeries(founds) {
    if (!selected) return;
    const s = await api("api/v1/series/" + encodeURIComponent(selected));
    let gpu = null;
    if (s.kind === "process" && s.memory && s.memory.gpu_series) {
      try {
        gpu = await api("api/v1/series/" + encodeURIComponent(s.memory.gpu_series));
      } catch (err) {
        if (err.status !== 404) throw err;  // no chart of the GPU: the process alone
      }
    }
    drawSeries(s, gpu, markersFor(s.id, founds));
  }

  // ------------------------------------------------------------------ refresh loop

  async function refresh() {
    try {
      const status = await api("api/v1/status");
      const alerts = (status.alerts || []).slice().sort(byUrgency);
      renderAlerts(alerts);
      renderHosts(status.hosts || []);
      renderServices(status.services || []);
      renderSilences(status.silences || [], status.notifier);
      const gpus = (status.hosts || []).reduce((n, h) => n + (h.gpus || []).length, 0);
      $("summary").textContent = (status.hosts || []).length + " hosts, " + gpus + " GPUs, " +
        (status.services || []).length + " services";
      await readDetails(alerts);
      await chooseSeries(alerts);
      await loadSeries(Array.from(details.values()));
      await aroundTop(alerts);
      $("updated").textContent = "updated " + clock(Date.now());
      $("error").textContent = "";
    } catch (err) {
      $("error").textContent = String(err.message || err);
    }
  }

  // What is around the most urgent alert: drawn again when it changes, else every
  // INDEX_REFRESH_MS (two dozen small charts every 5 s would only flicker).
  let aroundOf = null, aroundAt = 0;
  async function aroundTop(alerts) {
    const top = alerts.length ? details.get(alerts[0].fingerprint) : null;
    const fp = top ? top.alert.fingerprint : null;
    if (fp === aroundOf && Date.now() - aroundAt < INDEX_REFRESH_MS) return;
    aroundOf = fp;
    aroundAt = Date.now();
    if (top) await renderAround(top);
    else $("around-summary").textContent = "no alert";
  }

  // ------------------------------------------------------------------ one alert's page

  function pageFingerprint() {
    const parts = window.location.pathname.split("/");
    return decodeURIComponent(parts[parts.length - 1] || "");
  }

  function pairs(node, rows) {
    node.replaceChildren(...rows.flatMap(([key, value]) => [el("dt", null, key), el("dd", null, value)]));
  }

  const ANNOTATION_ORDER = ["summary", "description", "hint", "runbook"];

  function renderAlertPage(found) {
    const a = found.alert, ann = a.annotations || {}, labels = a.labels || {};
    const name = a.rule + " (" + a.status + ")";
    document.title = "ragwatch: " + name;
    $("alert-title").textContent = name;
    $("alert-title").dataset.status = a.status;
    $("alert-note").textContent = found.active ? "" : "No longer active: its last change.";
    $("alert-summary").textContent = ann.summary || "";
    pairs($("alert-details"), [
      ["status", a.status], ["severity", a.severity],
      ["value", number(a.value)], ["expected", number(a.expected)],
      ["since", when(a.starts_at)], ["ended", num(a.ends_at) === null ? "-" : when(a.ends_at)],
      ["silenced by", (found.silenced_by || []).join(", ") || "-"], ["fingerprint", a.fingerprint],
    ]);
    pairs($("alert-labels"), Object.keys(labels).sort().map((k) => [k, labels[k]]));
    const keys = ANNOTATION_ORDER.filter((k) => k in ann)
      .concat(Object.keys(ann).filter((k) => !ANNOTATION_ORDER.includes(k)).sort());
    pairs($("alert-annotations"), keys.map((k) => [k, ann[k]]));
    const changes = (found.history || []).map((h) => el("li", { "data-status": h.status },
      when(num(h.at) === null ? h.starts_at : h.at) + " " + h.status + ", value " + number(h.value)));
    if (!changes.length) changes.push(el("li", { class: "muted" }, "none in the alert history"));
    $("alert-history").replaceChildren(...changes);
  }

  function chooseAlertSeries(ids) {
    const select = $("series-select");
    select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
    if (!selected || !ids.includes(selected)) {
      const fromHash = seriesInHash();
      selected = ids.includes(fromHash) ? fromHash : ids[0] || null;
    }
    if (selected) select.value = selected;
    else $("series-meta").textContent = "no chart recorded for this alert";
  }

  function renderMissing(fp) {
    document.title = "ragwatch: no alert " + fp;
    $("alert-title").textContent = "No alert " + fp;
    $("alert-note").textContent = "It is not active and not in the alert history.";
  }

  let alertFound = [];  // the alert of this page, for the markers of a series picked

  // What moved around the alert (the advisor), its host's and services' charts small,
  // its service's requests: ragwatchMultiples (multiples.js).
  async function renderAround(found) {
    const labels = found.alert.labels || {};
    const query = ["host", "service"].filter((k) => labels[k])
      .map((k) => k + "=" + encodeURIComponent(labels[k])).join("&");
    if (!query) {
      $("around-summary").textContent = "no host or service on this alert";
      return;
    }
    let around;
    try {
      around = await api("api/v1/explain?" + query);
    } catch (err) {
      if (err.status !== 404) throw err;
      $("around-summary").textContent = "its host and service are no longer in the status";
      return;
    }
    $("around-summary").textContent = around.moves.length
      ? "anomalous in the last hour: " + around.summary : "nothing scored anomalous in the last hour";
    const marks = markersFor(null, [found]);
    await window.ragwatchMultiples.draw(api, $("multiples"), around.charts || [], marks);
    const requests = around.requests || {};
    const name = labels.service && requests[labels.service] ? labels.service
      : Object.keys(requests).sort()[0];
    $("scatter-title").textContent = name ? "Requests of " + name +
      " (the newest, context against output tokens)" : "Requests: none recorded";
    window.ragwatchMultiples.scatter($("scatter"), $("scatter-legend"), name ? requests[name] : null);
  }

  async function refreshAlert() {
    const fp = pageFingerprint();
    try {
      const found = await api("api/v1/alerts/" + encodeURIComponent(fp));
      alertFound = [found];
      renderAlertPage(found);
      chooseAlertSeries(found.series || []);
      await loadSeries([found]);
      await renderAround(found);
      $("updated").textContent = "updated " + clock(Date.now());
      $("error").textContent = "";
    } catch (err) {
      if (err.status === 404) renderMissing(fp);
      $("error").textContent = String(err.message || err);
    }
  }

  // ------------------------------------------------------------------ start

  $("series-select").addEventListener("change", (ev) => {
    selected = ev.target.value;
    picked = true;
    window.history.replaceState(null, "", "#series=" + encodeURIComponent(selected));
    const founds = PAGE === "alert" ? alertFound : Array.from(details.values());
    loadSeries(founds).catch((err) => { $("error").textContent = String(err.message || err); });
  });

  const run = PAGE === "alert" ? refreshAlert : refresh;
  run();
  window.setInterval(run, REFRESH_MS);
})();
