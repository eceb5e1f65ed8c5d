
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("mtpdiag-data").textContent);
  var grid = document.getElementById("grid");
  var pane = document.getElementById("pane");
  var byRank = {};
  D.views.forEach(function (v, i) { if (v[0] !== null) { byRank[v[0]] = i; } });
  var stackText = {};
  var MAX_TITLE_FRAMES = 12;

  function frameOf(k) { return D.frames[k]; }
  function stackOf(v) { return D.stacks[v[6]].map(frameOf); }
  function where(f) { return f[1] + ":" + f[2]; }

  function titleOf(i) {
    var v = D.views[i];
    if (!(v[6] in stackText)) {
      var fs = stackOf(v);
      var lines = fs.slice(0, MAX_TITLE_FRAMES).map(function (f) { return "  " + f[0] + "  (" + where(f) + ")"; });
      if (fs.length > MAX_TITLE_FRAMES) { lines.push("  \u2026 " + (fs.length - MAX_TITLE_FRAMES) + " more (click)"); }
      stackText[v[6]] = lines.join("\n");
    }
    return v[1] + ": " + D.texts[v[5]] + "\n" + stackText[v[6]];
  }

  var cells = grid.querySelectorAll("[data-i]");
  for (var c = 0; c < cells.length; c++) { cells[c].title = titleOf(+cells[c].getAttribute("data-i")); }

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }

  function openView(i) {
    var v = D.views[i];
    if (!v) { return; }
    document.getElementById("pane-title").textContent = v[1];
    document.getElementById("pane-meta").textContent =
      "host " + D.texts[v[2]] + (v[3] !== null ? ", pid " + v[3] : "") + ", state " + D.texts[v[4]];
    document.getElementById("pane-doing").textContent = D.texts[v[5]];
    var ol = document.getElementById("pane-frames");
    ol.textContent = "";
    var fs = stackOf(v);
    if (!fs.length) { ol.appendChild(el("li", "no stack", "dim")); }
    fs.forEach(function (f, k) {
      var li = el("li", undefined, k === v[7] ? "site" : "");
      li.appendChild(el("code", f[0], "fn"));
      li.appendChild(document.createTextNode(" "));
      li.appendChild(el("span", "(" + where(f) + ")", "loc"));
      if (k === v[7]) { li.appendChild(el("span", " ← call site", "mark")); }
      ol.appendChild(li);
    });
    var old = grid.querySelector(".sel");
    if (old) { old.classList.remove("sel"); }
    var cell = grid.querySelector('[data-i="' + i + '"]');
    if (cell) { cell.classList.add("sel"); }
    pane.hidden = false;
    pane.setAttribute("data-view", String(i));
    if (v[0] !== null) { pane.setAttribute("data-rank", String(v[0])); } else { pane.removeAttribute("data-rank"); }
  }

  function fromHash() {
    var m = /^#rank=(\d+)$/.exec(location.hash);
    if (m && m[1] in byRank) { openView(byRank[m[1]]); }
  }

  grid.addEventListener("click", function (ev) {
    var cell = ev.target.closest("[data-i]");
    if (!cell) { return; }
    var i = +cell.getAttribute("data-i");
    openView(i);
    if (D.views[i][0] !== null) {
      try { history.replaceState(null, "", "#rank=" + D.views[i][0]); } catch (e) { /* file: quirks */ }
    }
  });
  document.getElementById("pane-close").addEventListener("click", function () {
    pane.hidden = true;
    var old = grid.querySelector(".sel");
    if (old) { old.classList.remove("sel"); }
  });
  var legend = document.querySelector("[data-testid=legend]");
  legend.addEventListener("click", function (ev) {
    var item = ev.target.closest("[data-g]");
    if (!item) { return; }
    var g = item.getAttribute("data-g");
    var on = grid.getAttribute("data-focus") !== g;
    if (on) { grid.setAttribute("data-focus", g); } else { grid.removeAttribute("data-focus"); }
    legend.querySelectorAll("[data-g]").forEach(function (x) { x.classList.toggle("on", on && x === item); });
  });
  window.addEventListener("hashchange", fromHash);
  fromHash();
  document.documentElement.setAttribute("data-ready", "1");
})();
