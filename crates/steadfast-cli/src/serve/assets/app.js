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
