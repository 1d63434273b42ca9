// Steadfast serve: confirmation before an operation, and updates without
// reloading. No inline script runs on these pages (the Content-Security-Policy
// forbids it); this file is the only script.
"use strict";

document.addEventListener("submit", function (ev) {
  var form = ev.target;
  var question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    ev.preventDefault();
  }
});

// A form someone has typed into is not replaced under them.
var dirty = false;
document.addEventListener("input", function () { dirty = true; });

function refresh() {
  var main = document.getElementById("content");
  if (!main || dirty || main.contains(document.activeElement) && document.activeElement.form) {
    return;
  }
  fetch(window.location.href, { headers: { "X-Steadfast-Refresh": "1" }, credentials: "same-origin" })
    // A page that sends the browser elsewhere (to log in again) is not
    // put in place of this one.
    .then(function (r) { return r.ok && !r.redirected ? r.text() : null; })
    .then(function (html) {
      if (!html || dirty) { return; }
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.getElementById("content");
      if (fresh && fresh.innerHTML !== main.innerHTML) {
        // Keep what the reader opened or closed.
        var open = Array.prototype.map.call(main.querySelectorAll("details"), function (d) { return d.open; });
        main.innerHTML = fresh.innerHTML;
        Array.prototype.forEach.call(main.querySelectorAll("details"), function (d, i) {
          if (i < open.length) { d.open = open[i]; }
        });
      }
    })
    .catch(function () {});
}

var every = Number(document.body.getAttribute("data-refresh") || "0");
if (every > 0) {
  window.setInterval(refresh, every * 1000);
}

// A run's events as they happen (Server-Sent Events). The browser reconnects
// by itself after a break and says the last event it got (Last-Event-ID), so
// the list goes on where it stopped; the stream ends with the run's ending
// or stop, and then the page stops listening.
(function () {
  var box = document.getElementById("events");
  var list = document.getElementById("event-list");
  var state = document.getElementById("events-state");
  if (!box || !list || !window.EventSource) { return; }
  var source = new EventSource(box.getAttribute("data-src"));
  var shown = {};
  function add(kind, text, key) {
    if (key !== undefined) {
      if (shown[key]) { return; }
      shown[key] = true;
    }
    var li = document.createElement("li");
    li.className = kind;
    li.textContent = text;
    list.appendChild(li);
  }
  function data(ev) {
    try { return JSON.parse(ev.data); } catch (e) { return {}; }
  }
  source.addEventListener("open", function () { state.textContent = "live"; });
  source.addEventListener("error", function () {
    if (source.readyState !== EventSource.CLOSED) { state.textContent = "reconnecting"; }
  });
  // The server could not watch the run (the store failed, the run cannot
  // be read): it says why once and ends the stream.
  source.addEventListener("watch-error", function (ev) {
    var d = data(ev);
    add("failed", "cannot watch: " + d.error);
    source.close();
    state.textContent = "stopped";
  });
  source.addEventListener("event", function (ev) {
    var d = data(ev);
    // Not deduplicated: the server sends each event once, after a
    // reconnect too.
    add("event", "#" + d.seq + " " + d.step + " (attempt " + d.attempt + ") " + JSON.stringify(d.value));
  });
  source.addEventListener("signal", function (ev) {
    var d = data(ev);
    add("event", "#" + d.seq + " signal " + d.signal + " from " + d.by + " " + JSON.stringify(d.data));
  });
  source.addEventListener("started", function (ev) {
    var d = data(ev);
    add("started", "started " + d.step + " (attempt " + d.attempt + ")");
  });
  source.addEventListener("superseded", function (ev) {
    var d = data(ev);
    add("superseded", "superseded: the events of " + d.step + " through #" + d.through + " are of an execution that did not finish", JSON.stringify(["s", d.step, d.through]));
  });
  source.addEventListener("done", function (ev) {
    var d = data(ev);
    add("done", "done " + d.step + " (step " + d.index + ")", "d" + d.index);
  });
  source.addEventListener("failed", function (ev) {
    var d = data(ev);
    add("failed", "failed " + d.step + " (attempt " + d.attempt + "): " + d.error + (d.retrying ? "; it will be tried again" : ""), "f" + d.index + "." + d.attempt);
  });
  ["waiting", "waiting_for_signal", "sleeping", "completed", "ended", "gone"].forEach(function (kind) {
    source.addEventListener(kind, function (ev) {
      var d = data(ev);
      var text = kind === "waiting" ? "waiting at gate " + d.gate
        : kind === "waiting_for_signal" ? "waiting at " + d.step + " for signal " + d.signal
        : kind === "sleeping" ? "sleeping at " + d.step + " until " + d.until
        : kind === "ended" ? "ended " + d.status
        : kind === "gone" ? "the run was deleted" : "completed";
      add(kind, text, "end");
      source.close();
      state.textContent = kind;
      // The run's page above shows the ending now, not at its next refresh
      // (unless it showed it already: a form being filled stays put).
      var ending = kind === "ended" ? d.status : kind === "waiting_for_signal" ? "waiting" : kind;
      if (ending !== box.getAttribute("data-status")) { refresh(); }
    });
  });
}());
