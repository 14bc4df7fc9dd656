// postern console: keeps the approvals list live (server-sent events) and nothing else.
// Served from postern itself; the page's CSP allows no other script.
(function () {
  "use strict";
  var live = document.querySelector("[data-live]");
  if (!live || !window.EventSource) return;
  var url = live.getAttribute("data-live");
  var pending = false;
  function refresh() {
    if (pending) return;
    pending = true;
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.redirected || !r.ok) { window.location.reload(); return null; }
        return r.text();
      })
      .then(function (html) {
        // The list is rendered by postern with every value escaped.
        if (html !== null) live.innerHTML = html;
      })
      .catch(function () {})
      .then(function () { pending = false; });
  }
  var feed = new EventSource("/ui/events");
  feed.addEventListener("approvals", refresh);
  feed.addEventListener("open", refresh);
})();
