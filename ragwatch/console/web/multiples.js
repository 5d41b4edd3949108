// ragwatch small multiples: what moved around an alert, without the hunt.
//
// An alert's page asks the advisor (/api/v1/explain) about the alert's host and service:
// the signals that moved (ranked, in words), the chart series of the host's GPUs and
// processes and of the service instances on it (memory with total and projection,
// utilisation, power; tokens/s, decode speed, per-stage P95), and each service's newest
// requests. Each chart is drawn small, with its expected value and band (or its forecast)
// and, under it, a strip of its anomaly score (white 0 to red 1); the requests as a
// scatter of context against output tokens, the outliers and a new cluster coloured.
//
// What is drawn is written on the elements as data attributes (data-series, data-points,
// data-band, data-score-max on each multiple; data-points and data-kinds on the scatter),
// for the browser tests and the developer tools.
(function () {
  "use strict";

  const TILE = 340;  // a multiple's smallest width (CSS .multiples), px
  const GAP = 8;  // between tiles (CSS .multiples gap), px
  const LIMIT = 360;  // points of each multiple: its last 6 hours
  const KIND_COLORS = ["rgba(21,101,192,0.45)", "#e65100", "#8e24aa"];  // usual, away, new
  const KIND_NAMES = ["usual", "outliers", "new cluster"];
  const WORDS = {
    fb_used: "memory", gpu_util: "utilisation", power_w: "power", gpu_mem: "GPU memory",
    tokens_per_s: "output tokens/s", decode_tps: "decode speed", e2e_p95: "end-to-end P95",
    retriever_p95: "retriever P95", reranker_p95: "reranker P95", llm_p95: "LLM P95",
  };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    node.append(...children);
    return node;
  }

  // "GPU 1 · utilisation (%)", "rag-api-1 · decode speed (tokens/s)"
  function title(s) {
    const lab = s.labels || {}, suffix = s.id.slice(s.id.lastIndexOf(":") + 1);
    const where = s.kind === "gpu" ? "GPU " + (lab.gpu || "?") + (lab.mig ? "/" + lab.mig : "")
      : s.kind === "process" ? "pid " + (lab.pid || "?") + (lab.process ? " " + lab.process : "")
      : s.kind === "service" ? (lab.instance || lab.service || "?") : (lab.target || "?");
    const unit = s.unit === "bytes" ? "GB" : s.unit;
    return (lab.host && s.kind !== "service" ? lab.host + " " : "") + where + " · " +
      (WORDS[suffix] || s.signal) + (unit ? " (" + unit + ")" : "");
  }

  // The anomaly score under a chart: one column per point, white at 0 to red at 1.
  function strip(canvas, x, score, u) {
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    let top = 0;
    const left = u.bbox.left / devicePixelRatio, width = u.bbox.width / devicePixelRatio;
    const step = x.length > 1 ? width / (x.length - 1) : width;
    x.forEach((t, i) => {
      const v = score ? score[i] : null;
      if (v === null || v === undefined) return;
      top = Math.max(top, v);
      ctx.fillStyle = "rgba(198,40,40," + Math.max(0.04, Math.min(1, v)).toFixed(2) + ")";
      const at = u.valToPos(t, "x");
      ctx.fillRect(left + at - step / 2, 0, Math.max(1, step), canvas.height);
    });
    return top;
  }

  // The plot width of each tile of ``node``'s grid (as many tiles of TILE px as fit).
  function plotWidth(node) {
    const width = Math.max(TILE, node.clientWidth);
    const cols = Math.max(1, Math.floor((width + GAP) / (TILE + GAP)));
    return Math.floor((width - (cols - 1) * GAP) / cols) - 14;  // less padding and border
  }

  function multiple(s, marks, width) {
    const box = el("div", { class: "multiple", "data-series": s.id });
    const plot = el("div", { class: "plot" });
    const canvas = el("canvas", { class: "strip", width: String(width), height: "10" });
    box.append(el("div", { class: "title" }, title(s)), plot, canvas);
    const m = window.ragwatchChart.model(s, null, marks);
    const u = window.ragwatchChart.valueChart(plot, width, m, true);
    const top = strip(canvas, m.x, m.score, u);
    box.dataset.points = String(s.points.length);
    box.dataset.band = m.band ? "1" : "0";
    box.dataset.scoreMax = m.score ? top.toFixed(3) : "";
    box.dataset.lines = JSON.stringify(m.lines.map((l) => l.opts.label));
    return { box: box, chart: u };
  }

  let drawn = [];  // uPlot instances of the multiples drawn last

  async function draw(api, node, ids, marks) {
    const series = [];
    for (const id of ids) {
      try {
        series.push(await api("api/v1/series/" + encodeURIComponent(id) + "?limit=" + LIMIT));
      } catch (err) {
        if (err.status !== 404) throw err;  // swept since the index was read
      }
    }
    for (const u of drawn) u.destroy();
    const width = plotWidth(node);
    const made = series.filter((s) => s.points.length).map((s) => multiple(s, marks, width));
    drawn = made.map((x) => x.chart);
    node.replaceChildren(...made.map((x) => x.box));
    node.dataset.charts = String(made.length);
  }

  // The requests: context tokens across, output tokens up; outliers and a new cluster
  // coloured, the clusters' centres crossed.
  function scatter(canvas, legend, view) {
    const ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height, pad = 52;
    ctx.clearRect(0, 0, W, H);
    const pts = (view && view.points) || [];
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    const xmax = Math.max(1, ...xs) * 1.05, ymax = Math.max(1, ...ys) * 1.05;
    const px = (v) => pad + (v / xmax) * (W - pad - 10), py = (v) => H - pad + 10 - (v / ymax) * (H - pad);
    ctx.strokeStyle = "#999"; ctx.fillStyle = "#555"; ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath(); ctx.moveTo(pad, 6); ctx.lineTo(pad, H - pad + 10); ctx.lineTo(W - 6, H - pad + 10);
    ctx.stroke();
    for (let i = 0; i <= 4; i++) {
      ctx.textAlign = i === 0 ? "left" : i === 4 ? "right" : "center";
      ctx.fillText(String(Math.round((xmax * i) / 4)), px((xmax * i) / 4), H - pad + 24);
      ctx.textAlign = "right";
      ctx.fillText(String(Math.round((ymax * i) / 4)), pad - 4, py((ymax * i) / 4) + 4);
    }
    const f = (view && view.features) || ["context_tokens", "output_tokens"];
    ctx.textAlign = "center";
    ctx.fillText(f[0] + " →", W / 2, H - 4);
    ctx.save(); ctx.translate(10, H / 2 - 20); ctx.rotate(-Math.PI / 2); ctx.fillText(f[1] + " →", 0, 0);
    ctx.restore();
    ctx.textAlign = "left";
    const counts = [0, 0, 0];
    for (const kind of [0, 1, 2]) {  // the usual first: outliers stay on top
      ctx.fillStyle = KIND_COLORS[kind];
      for (const p of pts) {
        if (p[2] !== kind) continue;
        counts[kind]++;
        ctx.beginPath(); ctx.arc(px(p[0]), py(p[1]), kind ? 3.5 : 2.5, 0, 2 * Math.PI); ctx.fill();
      }
    }
    ctx.strokeStyle = "#111"; ctx.lineWidth = 1.5;
    for (const c of (view && view.clusters) || []) {
      ctx.beginPath(); ctx.moveTo(px(c[0]) - 5, py(c[1]) - 5); ctx.lineTo(px(c[0]) + 5, py(c[1]) + 5);
      ctx.moveTo(px(c[0]) - 5, py(c[1]) + 5); ctx.lineTo(px(c[0]) + 5, py(c[1]) - 5); ctx.stroke();
    }
    canvas.dataset.points = String(pts.length);
    canvas.dataset.kinds = JSON.stringify(counts);
    canvas.dataset.flagged = view && view.label ? view.label : "";
    const dot = (k) => {  // (a style attribute would break the page's CSP: style-src 'self')
      const i = el("i");
      i.style.background = KIND_COLORS[k];
      return i;
    };
    legend.replaceChildren(...KIND_NAMES.map((name, k) => el("span", { class: "key" },
      dot(k), name + " " + counts[k])),
      el("span", { class: "key" }, "× cluster centres"),
      view && view.label ? el("span", { class: "key flagged" }, "new: " + view.label) : "");
  }

  window.ragwatchMultiples = { draw: draw, scatter: scatter, title: title };
})();
