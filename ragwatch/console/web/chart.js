// ragwatch charts: one series drawn with uPlot (vendored), every time in UTC.
//
// A chart shows a series' value, its forecast or baseline (dashed, the band between them
// shaded) and, below, its anomaly score; a chart of a signal the generic detector scores
// (a band chart) shows its expected value (dashed) and its band (shaded) instead. A chart of memory (a GPU's or a process's bytes)
// also shows a line at the GPU's total memory and a dashed projection from the GPU's last
// point at its current growth to where it meets the total (when the status says it runs
// out of memory), labelled with the UTC time of the OOM; a process's chart has its own
// scale on the left and the GPU's used memory, total and projection on the right (0 to
// total). Vertical markers show when the alerts the series charts went pending, firing
// and resolved.
//
// What is drawn is also written on the chart's element as data attributes (data-points,
// data-xticks, data-total-bytes, data-oom-at, data-markers, ...): the browser tests read
// them, and anyone can in the developer tools.
(function () {
  "use strict";

  const GB = 1e9;
  const HOUR = 3600;
  const MIN_HORIZON_S = 12 * HOUR;  // a projection is drawn to the OOM up to
  const HORIZON_SPANS = 2;          // max(12 h, 2x the data's span) past the last point
  const COLORS = { value: "#1565c0", gpu: "#7e57c2", total: "#424242", forecast: "#6d4c41",
                   score: "#c62828", band: "rgba(109,76,65,0.45)" };
  const MARK_COLORS = { pending: "#e0a100", firing: "#c62828", resolved: "#2e7d32" };

  // ---------------------------------------------------------------- UTC text

  function pad(n) { return String(n).padStart(2, "0"); }
  function num(v) { return typeof v === "number" && isFinite(v) ? v : null; }

  // "2026-12-02 14:05 UTC"
  function utc(ts) {
    const n = num(ts);
    return n === null ? "-" : new Date(n * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC";
  }
  function hhmm(ts) {
    const d = new Date(ts * 1000);
    return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
  }
  function day(ts) { return new Date(ts * 1000).toISOString().slice(0, 10); }

  // Tick labels of the time axis, in UTC: "HH:MM", with the date under the first tick and
  // under the first tick of each new day; only dates when ticks are a day or more apart.
  function tickLabels(splits, incr) {
    return splits.map((ts, i) => {
      if (incr >= 86400) return day(ts);
      const newDay = i === 0 || day(ts) !== day(splits[i - 1]);
      return newDay ? hhmm(ts) + "\n" + day(ts) : hhmm(ts);
    });
  }

  // ---------------------------------------------------------------- the model

  // What one chart draws: x (event times, seconds), the lines (uPlot series and their
  // data), the y range, markers, the memory facts. Pure: no DOM.
  function model(s, gpu, marks) {
    const bytes = s.unit === "bytes";
    const scale = (v) => (num(v) === null ? null : bytes ? v / GB : v);
    const unit = bytes ? "GB" : s.unit || "";
    const own = new Map(s.points.map((p) => [p[0], p]));
    const x = Array.from(own.keys()).sort((a, b) => a - b);
    const m = { x: x, unit: unit, lines: [], bands: [], marks: [], memory: null, score: null,
                ranges: {} };
    const col = (f) => x.map((t) => (own.has(t) ? f(own.get(t)) : null));
    m.lines.push({ opts: { label: valueLabel(s, unit), stroke: COLORS.value, width: 2, scale: "y" },
                   data: col((p) => scale(p[1])) });
    const forecast = col((p) => scale(p[2]));
    if (s.band) {  // [ts, value, expected, score, lower, upper]: the band shaded
      m.lines.push({ opts: { label: "expected", stroke: COLORS.forecast, dash: [6, 4], width: 1.5,
                             scale: "y" }, data: forecast });
      for (const [label, at] of [["band upper", 5], ["band lower", 4]]) {
        m.lines.push({ opts: { label: label, stroke: COLORS.band, width: 1, scale: "y",
                               points: { show: false } }, data: col((p) => scale(p[at])) });
      }
      m.bands = [{ series: [3, 4], fill: "rgba(109,76,65,0.14)" }];
      m.band = true;
      m.ranges.y = bandRange(m.lines.map((l) => l.data));
    } else if (forecast.some((v) => v !== null)) {
      m.lines.push({ opts: { label: "forecast / baseline", stroke: COLORS.forecast,
                             dash: [6, 4], width: 1.5, scale: "y" }, data: forecast });
      // the band between actual and forecast: red where below it, amber where above
      m.bands = [{ series: [2, 1], fill: "rgba(198,40,40,0.18)" },
                 { series: [1, 2], fill: "rgba(224,161,0,0.18)" }];
    }
    const score = col((p) => p[3]);
    if (score.some((v) => v !== null)) m.score = score;
    m.marks = (marks || []).filter((k) => num(k.ts) !== null);
    widen(m);
    if (bytes && s.memory) addMemory(m, s, gpu ? gpu.points : null);
    return m;
  }

  // A band chart's y range: its values and expected values, and its band where it is not
  // much wider than usual (a young detector's band is wide: it would flatten the rest).
  function bandRange(lines) {
    const [value, expected, upper, lower] = lines;
    const widths = upper.map((u, i) => (u !== null && lower[i] !== null ? u - lower[i] : null))
      .filter((w) => w !== null).sort((a, b) => a - b);
    const usual = widths.length ? widths[Math.floor(widths.length / 2)] : 0;
    const ys = value.concat(expected).filter((v) => v !== null);
    upper.forEach((u, i) => {
      if (u !== null && lower[i] !== null && u - lower[i] <= 2 * usual) ys.push(u, lower[i]);
    });
    if (!ys.length) return [0, 1];
    const lo = Math.min(...ys), hi = Math.max(...ys), pad = Math.max((hi - lo) * 0.08, 1e-9);
    return [lo - pad, hi + pad];
  }

  function valueLabel(s, unit) {
    const lab = s.labels || {};
    if (s.kind === "process") {
      return (lab.process || "process") + " pid " + (lab.pid || "?") + " (" + unit + ")";
    }
    if (s.kind === "gpu") return "GPU " + (lab.gpu || "?") + " used (" + unit + ")";
    return s.signal + " (" + unit + ")";
  }

  // The GPU's used memory (a process's chart, on a scale of its own), its total, the
  // projection to the OOM.
  function addMemory(m, s, gpuPoints) {
    const mem = s.memory, x = m.x, lab = s.labels || {};
    const total = num(mem.total_bytes), rate = num(mem.growth_bytes_per_s);
    const gpuName = "GPU " + (lab.gpu || "?") + (lab.mig ? "/" + lab.mig : "");
    if (total === null || (s.kind === "process" && !gpuPoints)) return;
    const scale = s.kind === "process" ? "gpu" : "y";
    let used = m.lines[0].data;  // the GPU's memory: its own chart, or its series beside
    if (s.kind === "process") {
      used = alongside(x, gpuPoints).map((v) => (v === null ? null : v / GB));
      m.lines.push({ opts: { label: gpuName + " used, all processes (GB)", stroke: COLORS.gpu,
                             width: 1.5, spanGaps: true, scale: scale }, data: used });
    }
    m.memory = { total: total, rate: rate, oomAt: null, beyond: false, gpu: gpuName, scale: scale };
    m.ranges[scale] = [0, (total / GB) * 1.04];
    const last = lastPoint(x, used);
    // the status' time of OOM (its time to exhaustion), else the last point at the growth
    const oomAt = !last ? null : num(mem.oom_at) !== null ? mem.oom_at :
      rate !== null && rate > 0 ? last.t + (total - last.v * GB) / rate : null;
    if (oomAt !== null && oomAt > last.t) {
      const span = x.length ? x[x.length - 1] - x[0] : 0;
      const end = Math.min(oomAt, last.t + Math.max(MIN_HORIZON_S, HORIZON_SPANS * span));
      Object.assign(m.memory, { oomAt: oomAt, beyond: oomAt > end, from: last, end: end });
      x.push(end);
      for (const line of m.lines) line.data.push(null);
      if (m.score) m.score.push(null);
      const slope = (total / GB - last.v) / (oomAt - last.t);  // GB a second
      const proj = x.map((t) => (t === last.t ? last.v : t === end ? last.v + slope * (end - last.t) : null));
      m.lines.push({ opts: { label: "projection: full " + utc(oomAt) +
                               (rate !== null ? " (" + (rate * HOUR / GB).toFixed(2) + " GB/h)" : ""),
                             stroke: scale === "gpu" ? COLORS.gpu : COLORS.value, dash: [8, 5],
                             width: 2, spanGaps: true,
                             points: { show: false }, scale: scale }, data: proj });
    }
    m.lines.push({ opts: { label: gpuName + " total " + (total / GB).toFixed(1) + " GB",
                           stroke: COLORS.total, width: 1.5, dash: [2, 3], points: { show: false },
                           scale: scale }, data: x.map(() => total / GB) });
  }

  // Another series' values at the times ``x``: its last point at or before each, if it is
  // at most two minutes older (both are a point a minute: the same times, mostly).
  function alongside(x, points) {
    const out = [];
    let i = 0;
    for (const t of x) {
      while (i < points.length && points[i][0] <= t) i++;
      const p = i ? points[i - 1] : null;
      out.push(p && t - p[0] <= 120 && num(p[1]) !== null ? p[1] : null);
    }
    return out;
  }

  function lastPoint(x, ys) {
    for (let i = ys.length - 1; i >= 0; i--) if (ys[i] !== null) return { t: x[i], v: ys[i] };
    return null;
  }

  // Markers before the first point widen the chart to them (a point in time with no data).
  function widen(m) {
    const first = m.x.length ? m.x[0] : null;
    const early = m.marks.map((k) => k.ts).filter((t) => first === null || t < first);
    if (!early.length) return;
    const t = Math.min(...early);
    m.x.unshift(t);
    for (const line of m.lines) line.data.unshift(null);
    if (m.score) m.score.unshift(null);
  }

  // ---------------------------------------------------------------- uPlot

  function timeAxis(el) {
    return {
      values: (u, splits, axisIdx, space, incr) => {
        const labels = tickLabels(splits, incr);
        el.dataset.xsplits = JSON.stringify(splits);
        el.dataset.xticks = JSON.stringify(labels);
        return labels;
      },
    };
  }

  function base(el, width, height) {
    return {
      width: width, height: height,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
      cursor: { sync: { key: "ragwatch" } },
      scales: { x: { time: true } },
      series: [{ label: "time (UTC)", value: (u, v) => (v === null ? "--" : utc(v)) }],
      axes: [timeAxis(el)],
    };
  }

  // ``small``: a small multiple (shorter, no legend: its title says what it is)
  function valueChart(el, width, m, small) {
    const opts = base(el, width, small ? 130 : 280);
    if (small) opts.legend = { show: false };
    opts.series = opts.series.concat(m.lines.map((l) => l.opts));
    const lab = m.lines[0].opts.label;
    if (m.memory && m.memory.scale === "gpu") {
      opts.axes.push({ scale: "y", label: lab, size: 60, stroke: COLORS.value });
      opts.axes.push({ scale: "gpu", side: 1, label: m.memory.gpu + " (GB)", size: 60,
                       stroke: COLORS.gpu, grid: { show: false } });
    } else {
      opts.axes.push({ scale: "y", label: small ? "" : m.unit, size: small ? 48 : 60 });
    }
    for (const [key, range] of Object.entries(m.ranges)) opts.scales[key] = { range: () => range };
    if (m.bands.length) opts.bands = m.bands;
    el.ragwatchModel = m;
    opts.hooks = { draw: [(u) => overlay(u, el.ragwatchModel, !small, true)] };
    const u = new uPlot(opts, [m.x, ...m.lines.map((l) => l.data)], el);
    describe(el, m);
    return u;
  }

  function scoreChart(el, width, m) {
    const opts = base(el, width, 120);
    opts.series.push({ label: "anomaly score", stroke: COLORS.score, width: 1.5,
                       fill: "rgba(198,40,40,0.1)" });
    opts.scales.y = { range: [0, 1] };
    opts.axes.push({ label: "score", size: 60 });
    if (m.memory && m.memory.scale === "gpu") {  // as wide as the value chart's plot
      opts.axes.push({ scale: "y", side: 1, size: 60, label: " ", values: () => [],
                       grid: { show: false }, ticks: { show: false } });
    }
    el.ragwatchModel = m;
    opts.hooks = { draw: [(u) => overlay(u, el.ragwatchModel, false, false)] };
    return new uPlot(opts, [m.x, m.score], el);
  }

  // New data of the same lines into charts made by valueChart and scoreChart (no flicker).
  function update(charts, els, m) {
    els[0].ragwatchModel = m;
    els[1].ragwatchModel = m;
    charts[0].setData([m.x, ...m.lines.map((l) => l.data)]);
    if (charts[1] && m.score) charts[1].setData([m.x, m.score]);
    describe(els[0], m);
  }

  // Markers (their times written beside when ``labelled``) and the OOM label (``oom``), as
  // elements over the plot (drawn again on every redraw).
  function overlay(u, m, labelled, oom) {
    for (const old of u.over.querySelectorAll(".mark")) old.remove();
    const width = u.over.clientWidth;
    m.marks.forEach((k, i) => {
      const left = u.valToPos(k.ts, "x");
      if (!(left >= 0 && left <= width)) return;
      const line = document.createElement("div");
      line.className = "mark marker " + k.status;
      line.dataset.status = k.status;
      line.dataset.ts = String(k.ts);
      line.style.left = left + "px";
      line.style.borderLeftColor = MARK_COLORS[k.status] || "#555";
      if (labelled) {  // one under the other: changes minutes apart stay readable
        const text = document.createElement("span");
        text.textContent = k.status + " " + hhmm(k.ts);
        text.style.top = 2 + 16 * (i % 4) + "px";
        line.append(text);
      }
      u.over.append(line);
    });
    const mem = m.memory;
    if (!oom || !mem || mem.oomAt === null) return;
    const at = mem.beyond ? mem.end : mem.oomAt;
    const label = document.createElement("div");
    label.className = "mark oom" + (mem.beyond ? " beyond" : "");
    label.textContent = (mem.beyond ? "→ " : "") + "OOM " + utc(mem.oomAt) + " (in " +
      ((mem.oomAt - mem.from.t) / HOUR).toFixed(1) + " h)";
    label.style.right = Math.max(0, width - u.valToPos(at, "x")) + "px";
    label.style.top = Math.max(0, u.valToPos(mem.total / GB, mem.scale) + 4) + "px";
    u.over.append(label);
  }

  function describe(el, m) {
    const mem = m.memory || {};
    el.dataset.tz = "UTC";
    el.dataset.lines = JSON.stringify(m.lines.map((l) => l.opts.label));
    el.dataset.markers = JSON.stringify(m.marks.map((k) => [k.status, k.ts]));
    el.dataset.totalBytes = num(mem.total) === null ? "" : String(mem.total);
    el.dataset.growth = num(mem.rate) === null ? "" : String(mem.rate);
    el.dataset.oomAt = num(mem.oomAt) === null ? "" : String(Math.round(mem.oomAt));
  }

  window.ragwatchChart = { model: model, valueChart: valueChart, scoreChart: scoreChart,
                           update: update, utc: utc, hhmm: hhmm, num: num };
})();
