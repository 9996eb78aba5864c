// typedq dashboard: refresh the live part of a page in place every few seconds
// (the element #live with data-refresh="SECONDS"), without reloading the page.
// The server answers a request with the header X-Partial: 1 with that part alone.
// Nothing refreshes while the user is typing in a form inside it.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !live.dataset.refresh) { return; }
  var every = Math.max(1, parseInt(live.dataset.refresh, 10) || 5) * 1000;
  function busy() {
    var el = document.activeElement;
    return el && live.contains(el) && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
  }
  function refresh() {
    if (document.hidden || busy()) { return; }
    fetch(window.location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null && !busy()) { live.innerHTML = html; } })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, every);
}());
