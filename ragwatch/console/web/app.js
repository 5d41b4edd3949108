// ragwatch live page: plain JS, no build step, uPlot vendored in static/vendor/.
//
// Every string from the API goes into the DOM as text (textContent / append(string)),
// never as HTML: labels, process names and hints come from the monitored fleet.
// Auth: open the page once as /?token=<RAGWATCH_SERVE_TOKEN>; the token is kept in
// sessionStorage (this tab only), removed from the address bar, and sent as
// "Authorization: Bearer" on every API call.
//
// Two pages run this script: the live page (/) and an alert's page (/alerts/<fingerprint>,
// where notifications link to: <body data-page="alert" data-root="../">).
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

  function num(v) { return typeof v === "number" && isFinite(v) ? v : null; }
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
  function when(ts) {
    const n = num(ts);
    return n === null ? "-" : new Date(n * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC";
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

  function renderAlerts(alerts) {
    const firing = alerts.filter((a) => a.status === "firing").length;
    $("alert-counts").textContent = "(" + firing + " firing, " + (alerts.length - firing) + " pending)";
    const items = alerts.map((a) => {
      const ann = a.annotations || {};
      return el("li", { class: "alert " + (a.status === "firing" ? "firing" : "pending"),
                        "data-alertname": a.rule, "data-fingerprint": a.fingerprint },
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
      (num(n.seen) !== null ? ", last seen " + new Date(n.seen * 1000).toLocaleTimeString() : ", never reported");
  }

  // ------------------------------------------------------------------ series chart

  let selected = null;       // series id shown
  let indexLoadedAt = 0;
  let charts = [];

  // The chart of the first alert that has one. The server says which series chart an
  // alert: the signal its rule is about (streams/series.py), not a table here.
  async function seriesForAlerts(alerts) {
    for (const a of alerts.slice(0, 5)) {
      try {
        const found = await api("api/v1/alerts/" + encodeURIComponent(a.fingerprint));
        if (found.series.length) return found.series[0];
      } catch (err) {
        if (err.status !== 404) throw err;  // 404: it resolved since
      }
    }
    return null;
  }

  async function loadIndex(alerts) {
    const index = await api("api/v1/series?limit=5000");
    const select = $("series-select");
    const ids = new Set(index.series.map((s) => s.id));
    const groups = {};
    for (const s of index.series) (groups[s.kind] = groups[s.kind] || []).push(s);
    const options = Object.keys(groups).sort().map((kind) => el("optgroup", { label: kind },
      ...groups[kind].map((s) => el("option", { value: s.id }, s.id))));
    select.replaceChildren(...options);
    indexLoadedAt = Date.now();
    if (!selected || !ids.has(selected)) {
      const fromHash = seriesInHash();
      const fromAlert = ids.has(fromHash) ? null : await seriesForAlerts(alerts);
      selected = ids.has(fromHash) ? fromHash : fromAlert || (index.series[0] || {}).id || null;
    }
    if (selected && !ids.has(selected)) select.append(el("option", { value: selected }, selected));
    if (selected) select.value = selected;
  }

  function seriesInHash() {
    return decodeURIComponent((window.location.hash.match(/^#series=(.*)$/) || [])[1] || "");
  }

  function chartWidth() { return Math.max(320, $("series-section").clientWidth - 20); }

  let drawn = "";            // what the charts show: series id and which lines

  function drawSeries(s) {
    const bytes = s.unit === "bytes";
    const scale = (v) => (v === null || v === undefined ? null : bytes ? v / GB : v);
    const ts = s.points.map((p) => p[0]);
    const value = s.points.map((p) => scale(p[1]));
    const forecast = s.points.map((p) => scale(p[2]));
    const score = s.points.map((p) => p[3]);
    const hasForecast = forecast.some((v) => v !== null);
    const hasScore = score.some((v) => v !== null);
    const data = hasForecast ? [ts, value, forecast] : [ts, value];
    const shape = [s.id, hasForecast, hasScore].join("|");
    if (shape === drawn && charts.length) {
      // same series: new data into the same charts (no flicker; scales follow the data)
      charts[0].setData(data);
      if (hasScore) charts[1].setData([ts, score]);
    } else {
      for (const c of charts) c.destroy();
      charts = [newValueChart(s, data, bytes ? "GB" : s.unit || "", hasForecast)];
      if (hasScore) charts.push(newScoreChart([ts, score]));
      drawn = shape;
    }
    $("chart").dataset.points = String(ts.length);
    $("chart").dataset.series = s.id;
    $("score-chart").dataset.points = String(hasScore ? ts.length : 0);
    $("series-meta").textContent = s.kind + " · " + labelText(s.labels || {}) + " · " +
      ts.length + " points" + (ts.length ? " · " + when(ts[0]) + " to " + when(ts[ts.length - 1]) : "");
  }

  function newValueChart(s, data, unit, hasForecast) {
    const series = [{}, { label: s.signal + " (" + unit + ")", stroke: "#1565c0", width: 2 }];
    const opts = { width: chartWidth(), height: 260, series: series, axes: [{}, { label: unit }],
                   scales: { x: { time: true } } };
    if (hasForecast) {
      series.push({ label: "forecast / baseline", stroke: "#6d4c41", dash: [6, 4], width: 1.5 });
      // the band between actual and forecast: red where below it, amber where above
      opts.bands = [{ series: [2, 1], fill: "rgba(198,40,40,0.18)" },
                    { series: [1, 2], fill: "rgba(224,161,0,0.18)" }];
    }
    return new uPlot(opts, data, $("chart"));
  }

  function newScoreChart(data) {
    return new uPlot({
      width: chartWidth(), height: 120,
      series: [{}, { label: "anomaly score", stroke: "#c62828", width: 1.5, fill: "rgba(198,40,40,0.1)" }],
      scales: { x: { time: true }, y: { range: [0, 1] } }, axes: [{}, { label: "score" }],
    }, data, $("score-chart"));
  }

  async function loadSeries() {
    if (!selected) return;
    const s = await api("api/v1/series/" + encodeURIComponent(selected));
    drawSeries(s);
  }

  // ------------------------------------------------------------------ refresh loop

  async function refresh() {
    try {
      const status = await api("api/v1/status");
      renderAlerts(status.alerts || []);
      renderHosts(status.hosts || []);
      renderServices(status.services || []);
      renderSilences(status.silences || [], status.notifier);
      const gpus = (status.hosts || []).reduce((n, h) => n + (h.gpus || []).length, 0);
      $("summary").textContent = (status.hosts || []).length + " hosts, " + gpus + " GPUs, " +
        (status.services || []).length + " services";
      if (Date.now() - indexLoadedAt > INDEX_REFRESH_MS) await loadIndex(status.alerts || []);
      await loadSeries();
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      $("error").textContent = "";
    } catch (err) {
      $("error").textContent = String(err.message || err);
    }
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
    const changes = (found.history || []).map((h) => el("li", null,
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

  async function refreshAlert() {
    const fp = pageFingerprint();
    try {
      const found = await api("api/v1/alerts/" + encodeURIComponent(fp));
      renderAlertPage(found);
      chooseAlertSeries(found.series || []);
      await loadSeries();
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      $("error").textContent = "";
    } catch (err) {
      if (err.status === 404) renderMissing(fp);
      $("error").textContent = String(err.message || err);
    }
  }

  // ------------------------------------------------------------------ start

  $("series-select").addEventListener("change", (ev) => {
    selected = ev.target.value;
    window.history.replaceState(null, "", "#series=" + encodeURIComponent(selected));
    loadSeries().catch((err) => { $("error").textContent = String(err.message || err); });
  });

  const run = PAGE === "alert" ? refreshAlert : refresh;
  run();
  window.setInterval(run, REFRESH_MS);
})();
