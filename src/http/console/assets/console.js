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
