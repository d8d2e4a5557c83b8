/* ddp-doctor HTML report: draws the per-rank timeline and the step-time breakdown from the
   embedded view JSON.  Written without libraries; every text goes through textContent. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (parent) parent.appendChild(e);
    return e;
  }
  function tip(node, text) { el("title", {}, node, text); return node; }
  function fmtS(s) {
    if (s === null || s === undefined || isNaN(s)) return "";
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
    if (s < 120) return s.toFixed(2) + " s";
    return (s / 60).toFixed(1) + " min";
  }
  function niceStep(range, n) {
    var raw = range / Math.max(1, n), p = Math.pow(10, Math.floor(Math.log(raw) / Math.LN10)), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }
  var view;
  try { view = JSON.parse(document.getElementById("ddp-view").textContent); } catch (e) { return; }

  function timeline() {
    var box = document.getElementById("timeline-chart");
    if (!box) return;
    var ranks = view.ranks || [];
    var any = ranks.some(function (r) { return (r.timeline || []).length > 0; });
    if (!ranks.length || !any) {
      var p = document.createElement("p"); p.className = "empty";
      p.textContent = ranks.length ? "No timeline was recorded for this run (it stopped before the first step, or the probe was off)."
                                   : "No ranks in this report (a lint-only report).";
      box.appendChild(p); return;
    }
    while (box.firstChild) box.removeChild(box.firstChild);
    var W = Math.max(700, box.clientWidth || 1200), gut = 190, right = 16, laneH = 52, top = 22;
    var tmax = view.tmax || 1, tlo = range === "training" ? trainStart() : 0, plotW = W - gut - right;
    var H = top + ranks.length * laneH + 26;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", "aria-label": "per-rank timeline",
                         "data-range": range}, box);
    function X(t) { return gut + Math.max(0, Math.min(1, (t - tlo) / (tmax - tlo))) * plotW; }
    var defs = el("defs", {}, svg);
    var pat = el("pattern", {id: "hatch", width: 8, height: 8, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"}, defs);
    el("rect", {width: 8, height: 8, fill: "#fdecea"}, pat);
    el("line", {x1: 0, y1: 0, x2: 0, y2: 8, stroke: "#e57373", "stroke-width": 3}, pat);
    // axis
    var axis = el("g", {"class": "axis"}, svg), step = niceStep(tmax - tlo, 10);
    for (var t = Math.ceil(tlo / step) * step; t <= tmax + 1e-9; t += step) {
      el("line", {x1: X(t), x2: X(t), y1: top - 4, y2: H - 22}, axis);
      el("text", {x: X(t), y: top - 8, "text-anchor": "middle", "class": "muted"}, axis, (+t.toFixed(3)) + " s");
    }
    ranks.forEach(function (r, i) {
      var y = top + i * laneH;
      var g = el("g", {"class": "lane" + (r.bad ? " bad" : ""), "data-rank": r.rank}, svg);
      el("rect", {"class": "lane-bg", x: gut, y: y + 3, width: plotW, height: laneH - 6, rx: 3}, g);
      el("text", {"class": "rank-label", x: 6, y: y + 19}, g, "rank " + r.rank);
      el("text", {"class": "muted", x: 6, y: y + 35}, g, (r.state || "") + (r.step !== null && r.step !== undefined ? "  step " + r.step : ""));
      var evs = r.timeline || [], last = {}, lastT = 0, progress = 0;
      evs.forEach(function (ev) {
        var end = (+ev.t || 0) + (+ev.dur || 0);
        lastT = Math.max(lastT, end);
        if (ev.kind === "step" || ev.kind === "epoch") progress = Math.max(progress, end);
      });
      var stopX = X(r.stop_t !== null && r.stop_t !== undefined ? r.stop_t : (r.bad ? tmax : lastT));
      if (!evs.length) {
        el("text", {"class": "muted", x: gut + 8, y: y + 27}, g, "no timeline recorded for this rank");
      } else if (r.bad && stopX - X(progress) > 2) {
        tip(el("rect", {x: X(progress), y: y + 3, width: stopX - X(progress), height: laneH - 6, fill: "url(#hatch)", opacity: 0.8}, g),
            "rank " + r.rank + ": no step completed after " + fmtS(progress));
      }
      var bandY = {step: y + 6, collective: y + 17, data_wait: y + 28};
      var lastLabelX = -1e9;
      evs.forEach(function (ev) {
        var t0 = +ev.t || 0, d = +ev.dur || 0, x = X(t0), w = Math.max(0, X(t0 + d) - x), k = ev.kind;
        if (t0 + d < tlo && k !== "stop") return;
        var px = Math.floor(x) + ":" + Math.floor(w);
        if (last[k] === px && k !== "stop" && k !== "epoch") return; // one mark per pixel and kind
        last[k] = px;
        var label = (ev.label ? ev.label + " - " : "") + k + " at " + fmtS(t0) + (d ? " for " + fmtS(d) : "");
        if (k === "epoch") {
          tip(el("line", {x1: x, x2: x, y1: y + 3, y2: y + laneH - 3, stroke: "var(--epoch)", "stroke-dasharray": "3 2"}, g), label);
          var lab = ev.label || "epoch";
          if (x > lastLabelX) {
            el("text", {x: x + 2, y: y + laneH - 6, "class": "muted", "font-size": 10}, g, lab);
            lastLabelX = x + 8 + 5.5 * lab.length;
          }
        } else if (k === "stall") {  // no rank showed a sign of life: a band over the lane, its cause in the tip
          tip(el("rect", {x: x, y: y + 3, width: Math.max(w, 1.2), height: laneH - 6, fill: "url(#hatch)",
                          stroke: "var(--stop)", "stroke-dasharray": "4 3", opacity: 0.7}, g), label);
        } else if (k === "stop") {
          var s = el("g", {"class": "stop"}, g);
          el("path", {d: "M" + x + " " + (y + 8) + " l6 7 l-6 7 l-6 -7 z", fill: "var(--stop)"}, s);
          tip(s, "stopped: " + label);
        } else {
          var color = k === "step" ? "var(--step)" : k === "collective" ? "var(--coll)" : k === "data_wait" ? "var(--wait)" : "var(--other)";
          var by = bandY[k] || y + 19;
          tip(el("rect", {x: x, y: by, width: Math.max(w, 1.2), height: 9, fill: color, opacity: 0.9}, g), label);
        }
      });
      if (r.bad) {
        var endX = stopX;
        el("line", {x1: endX, x2: endX, y1: y + 2, y2: y + laneH - 2, stroke: "var(--stop)", "stroke-width": 2.5}, g);
        var txt = "stopped" + (r.where ? ": " + r.where : "");
        var anchorRight = endX > gut + plotW * 0.6;
        el("text", {"class": "stop-text", x: anchorRight ? endX - 6 : endX + 6, y: y + laneH - 9, "text-anchor": anchorRight ? "end" : "start"}, g, txt);
      }
    });
    el("text", {x: gut + plotW, y: H - 6, "text-anchor": "end", "class": "muted"}, svg,
       "time since job start" + (tlo > 0 ? " (start-up before " + fmtS(tlo) + " hidden)" : ""));
  }

  // Start of training: the first step/epoch/data wait of any rank.  Start-up (imports, rendezvous,
  // DDP's parameter broadcast) often takes most of a short run; the default view skips it.
  function trainStart() {
    var lo = Infinity;
    (view.ranks || []).forEach(function (r) {
      (r.timeline || []).forEach(function (ev) {
        if (ev.kind === "step" || ev.kind === "epoch" || ev.kind === "data_wait") lo = Math.min(lo, +ev.t || 0);
      });
    });
    if (!isFinite(lo)) return 0;
    var span = (view.tmax || 1) - lo;
    return Math.max(0, lo - 0.03 * span);
  }
  var range = trainStart() > 0.3 * (view.tmax || 1) ? "training" : "all";
  function rangeButtons() {
    var bar = document.getElementById("timeline-range");
    if (!bar || trainStart() <= 0) return;
    [["training", "training only"], ["all", "whole run"]].forEach(function (b) {
      var btn = document.createElement("button");
      btn.type = "button"; btn.textContent = b[1]; btn.setAttribute("data-range", b[0]);
      btn.className = range === b[0] ? "on" : "";
      btn.addEventListener("click", function () {
        range = b[0];
        Array.prototype.forEach.call(bar.children, function (c) { c.className = c.getAttribute("data-range") === range ? "on" : ""; });
        timeline();
      });
      bar.appendChild(btn);
    });
  }

  function breakdown() {
    var box = document.getElementById("breakdown-chart");
    if (!box) return;
    var rows = (view.ranks || []).filter(function (r) { return r.timing && r.timing.steps; });
    if (!rows.length) {
      var p = document.createElement("p"); p.className = "empty";
      p.textContent = "No step timing was recorded for this run.";
      box.appendChild(p); return;
    }
    var parts = [["data_wait_s", "data wait", "var(--wait)"], ["compute_s", "compute", "var(--compute)"],
                 ["collective_s", "collective", "var(--coll)"], ["other_s", "other", "var(--other)"]];
    var per = rows.map(function (r) {
      var tm = r.timing, n = tm.steps, o = {rank: r.rank, bad: r.bad, steps: n};
      var known = 0;
      parts.slice(0, 3).forEach(function (p) { o[p[0]] = (+tm[p[0]] || 0) / n; known += o[p[0]]; });
      var total = tm.step_time_s ? (+tm.step_time_s) / n : known;
      o.other_s = Math.max(0, total - known); o.total = Math.max(total, known);
      return o;
    });
    var maxT = Math.max.apply(null, per.map(function (o) { return o.total; })) || 1;
    var W = Math.max(700, box.clientWidth || 1200), gut = 190, right = 150, barH = 22, gap = 10, top = 6;
    var H = top + per.length * (barH + gap), plotW = W - gut - right;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", "aria-label": "step time breakdown"}, box);
    per.forEach(function (o, i) {
      var y = top + i * (barH + gap), x = gut;
      var g = el("g", {"class": "bar" + (o.bad ? " bad" : ""), "data-rank": o.rank}, svg);
      el("text", {x: 6, y: y + 15, "class": o.bad ? "stop-text" : ""}, g, "rank " + o.rank + "  (" + o.steps + " steps)");
      parts.forEach(function (p) {
        var v = o[p[0]] || 0, w = v / maxT * plotW;
        if (w <= 0) return;
        tip(el("rect", {x: x, y: y, width: w, height: barH, fill: p[2]}, g),
            "rank " + o.rank + " " + p[1] + ": " + fmtS(v) + " per step (" + (o.total ? (100 * v / o.total).toFixed(0) : 0) + "%)");
        if (w > 44) el("text", {x: x + 4, y: y + 15, fill: "#fff", style: "fill:#fff"}, g, (100 * v / o.total).toFixed(0) + "%");
        x += w;
      });
      el("text", {x: x + 6, y: y + 15, "class": "muted"}, g, fmtS(o.total) + " / step");
    });
  }
  try { rangeButtons(); timeline(); } catch (e) { if (window.console) console.error(e); }
  try { breakdown(); } catch (e) { if (window.console) console.error(e); }
  document.body.setAttribute("data-rendered", "1");
})();
