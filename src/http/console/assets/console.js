// commitpoint console: the one script, served from /ui/assets (the CSP allows no inline
// script). Pages read fine without it; it adds a confirmation before destructive posts.
"use strict";
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// The quiet refresh: a page marked `data-refresh` is read again every few seconds and its
// content swapped in, so counts and states move without a reload. It waits while the tab
// is hidden, while a form field has the focus (a half-typed filter is not thrown away) and
// while an opened payload is being read; the button pauses it, remembered per browser.
(function () {
  var main = document.querySelector("main[data-refresh]");
  var header = document.querySelector("header.top");
  if (!main || !header || !window.fetch || !window.DOMParser) {
    return;
  }
  var EVERY_MS = 5000;
  var key = "commitpoint-refresh";
  var paused = window.localStorage && window.localStorage.getItem(key) === "off";
  var button = document.createElement("button");
  button.type = "button";
  button.id = "refresh-toggle";
  function label() {
    button.textContent = paused ? "Auto-refresh: paused" : "Auto-refresh: on";
    button.setAttribute("aria-pressed", paused ? "false" : "true");
  }
  label();
  button.addEventListener("click", function () {
    paused = !paused;
    if (window.localStorage) {
      window.localStorage.setItem(key, paused ? "off" : "on");
    }
    label();
  });
  header.appendChild(button);
  function busy() {
    var active = document.activeElement;
    var typing = active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
    return typing || main.querySelector("details[open]") !== null;
  }
  function refresh() {
    if (paused || document.hidden || busy()) {
      return;
    }
    window.fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (text) {
        if (text === null) {
          return;
        }
        var fresh = new DOMParser().parseFromString(text, "text/html").querySelector("main[data-refresh]");
        if (fresh && !paused && !busy()) {
          main.innerHTML = fresh.innerHTML;
          main.setAttribute("data-refreshed", new Date().toISOString());
        }
      })
      .catch(function () {});
  }
  window.setInterval(refresh, EVERY_MS);
})();
