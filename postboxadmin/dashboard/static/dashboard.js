// postbox dashboard: refreshes the overview from GET /v1/status. Every
// page works without this script; it only keeps the overview current.
(function () {
  "use strict";
  var root = document.getElementById("overview");
  if (!root) { return; }
  var url = root.getAttribute("data-status-url");
  var every = parseInt(root.getAttribute("data-refresh-ms"), 10) || 5000;
  var samples = [];
  try { samples = JSON.parse(document.getElementById("samples").textContent) || []; } catch (e) { samples = []; }
  var MAX = 180;
  var base = url.replace(/\/v1\/status$/, "");

  function secs(s) {
    if (s === 0) { return "0s"; }
    if (s < 1) { return Math.round(s * 1000) + "ms"; }
    if (s < 60) { return (Math.round(s * 1000) / 1000) + "s"; }
    var m = Math.floor(s / 60);
    return m + "m" + Math.round(s - m * 60) + "s";
  }
  // ranges writes sorted partition numbers as ranges: "0-3, 7, 9-10".
  function ranges(ps) {
    var out = [];
    for (var i = 0; i < ps.length;) {
      var j = i;
      while (j + 1 < ps.length && ps[j + 1] === ps[j] + 1) { j++; }
      out.push(j === i ? String(ps[i]) : ps[i] + "-" + ps[j]);
      i = j + 1;
    }
    return out.join(", ");
  }
  function text(id, v) { var el = document.getElementById(id); if (el) { el.textContent = v; } }
  function cell(tr, tag, v, cls) {
    var c = document.createElement(tag);
    if (tag === "th") { c.setAttribute("scope", "row"); }
    if (cls) { c.className = cls; }
    if (v instanceof Node) { c.appendChild(v); } else { c.textContent = String(v); }
    tr.appendChild(c);
    return c;
  }
  function rows(id, list, cols, empty, render) {
    var body = document.getElementById(id);
    if (!body) { return; }
    while (body.firstChild) { body.removeChild(body.firstChild); }
    if (!list.length) {
      var tr = document.createElement("tr");
      cell(tr, "td", empty).setAttribute("colspan", cols);
      body.appendChild(tr);
      return;
    }
    list.forEach(function (x) { var tr = document.createElement("tr"); render(tr, x); body.appendChild(tr); });
  }
  var charts = {
    pending: function (x) { return x.pending; },
    oldest_age: function (x) { return x.oldest_age; },
    rate: function (x) { return x.rate; },
    lag: function (x) { return x.lag; }
  };
  var units = { pending: "", oldest_age: "s", rate: "/s", lag: "s" };
  function draw() {
    Object.keys(charts).forEach(function (id) {
      var svg = document.getElementById("chart-" + id);
      if (!svg) { return; }
      var vals = samples.map(charts[id]);
      var hi = Math.max.apply(null, [0].concat(vals)) || 1;
      var pts = vals.map(function (v, i) {
        var x = vals.length > 1 ? i * 300 / (vals.length - 1) : 300;
        return x.toFixed(1) + "," + (58 - v / hi * 56).toFixed(1);
      }).join(" ");
      var line = svg.querySelector("polyline");
      if (!line) {
        line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
        line.setAttribute("fill", "none"); line.setAttribute("stroke", "currentColor"); line.setAttribute("stroke-width", "1.5");
        svg.appendChild(line);
      }
      line.setAttribute("points", pts);
      var cap = document.getElementById("cap-" + id);
      var last = vals.length ? vals[vals.length - 1] : 0;
      var summary = "now " + (+last.toPrecision(4)) + units[id] +
        ", highest " + (+Math.max.apply(null, [0].concat(vals)).toPrecision(4)) + units[id] + " over " + vals.length + " samples";
      var label = (cap ? cap.textContent : id) + ": " + summary;
      text("sum-" + id, summary);
      svg.setAttribute("aria-label", label);
      var title = svg.querySelector("title");
      if (title) { title.textContent = label; }
    });
  }
  function apply(st) {
    text("fig-pending", (st.pending_estimated ? "≈ " : "") + st.pending);
    text("fig-oldest", secs(st.oldest_pending_age_seconds));
    text("fig-unrouted", st.unrouted_pending);
    var dead = document.querySelector("#fig-dead a");
    if (dead) { dead.textContent = st.dead; }
    text("fig-published", (st.published_kept_estimated ? "≈ " : "") + st.published_kept);
    text("fig-unowned", st.partitions.unowned + " of " + st.partitions.total);
    rows("topics-body", st.topics, 7, "Nothing pending, dead or published in the last minute.", function (tr, t) {
      cell(tr, "th", t.topic);
      cell(tr, "td", t.routed ? "routed" : "unrouted (waits)");
      cell(tr, "td", t.pending, "n");
      cell(tr, "td", secs(t.oldest_pending_age_seconds), "n");
      if (t.dead) {
        var a = document.createElement("a");
        a.href = base + "/dead?topic=" + encodeURIComponent(t.topic);
        a.textContent = t.dead;
        cell(tr, "td", a, "n");
      } else { cell(tr, "td", 0, "n"); }
      cell(tr, "td", t.published_last_minute, "n");
      cell(tr, "td", secs(t.publish_lag_seconds), "n");
    });
    rows("relays-body", st.partitions.holders, 4, "No relay holds a partition.", function (tr, h) {
      cell(tr, "th", h.relay);
      cell(tr, "td", h.partitions.length, "n");
      cell(tr, "td", ranges(h.partitions), "wrap");
      cell(tr, "td", secs(h.lease_expires_in_seconds), "n");
    });
    if (st.shards) {
      rows("shards-body", st.shards, 4, "", function (tr, sh) {
        cell(tr, "th", sh.shard);
        var state = cell(tr, "td", "");
        if (sh.up) { state.textContent = "up"; } else {
          var strong = document.createElement("strong");
          strong.textContent = "down";
          state.appendChild(strong);
        }
        cell(tr, "td", sh.since.replace(/\.\d+Z$/, "Z"));
        cell(tr, "td", sh.error || "", "wrap");
      });
    }
    var rate = 0, lag = 0;
    st.topics.forEach(function (t) { rate += t.published_last_minute; lag = Math.max(lag, t.publish_lag_seconds); });
    samples.push({ at: new Date().toISOString(), pending: st.pending, oldest_age: st.oldest_pending_age_seconds, rate: rate / 60, lag: lag });
    if (samples.length > MAX) { samples.splice(0, samples.length - MAX); }
    draw();
    text("as-of", "As of " + new Date().toISOString().replace(/\.\d+Z$/, "Z"));
  }
  function problem(msg) {
    var p = document.getElementById("refresh-problem");
    if (!p) { return; }
    p.hidden = !msg;
    p.textContent = msg || "";
  }
  function tick() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } }).then(function (res) {
      if (res.status === 401) { throw new Error("Signed out: the session ended. Reload the page to sign in again."); }
      if (!res.ok) { throw new Error("The status could not be read (HTTP " + res.status + "); retrying."); }
      return res.json();
    }).then(function (st) { problem(""); apply(st); }, function (e) { problem(e.message); })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
