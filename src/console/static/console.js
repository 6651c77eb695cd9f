// agentrun console: live updates of the inbox. Served from the binary at /static/console.js (the
// Content-Security-Policy allows scripts from the console's own origin only, and no inline script).
// It never reads or stores a credential: the session cookie is HttpOnly.
(function () {
  "use strict";
  var rows = document.getElementById("inbox-rows");
  if (!rows) {
    return;
  }
  var rowsUrl = rows.getAttribute("data-rows-url");
  var eventsUrl = rows.getAttribute("data-events-url");
  var live = document.getElementById("live");
  var pending = null;

  // The table body comes from the server's templates, where every text is already escaped.
  function refresh() {
    pending = null;
    fetch(rowsUrl, { credentials: "same-origin", redirect: "manual", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (response.status === 200) {
          return response.text();
        }
        // Logged out or the session expired: show the login page.
        window.location.reload();
        return null;
      })
      .then(function (html) {
        if (html !== null) {
          rows.innerHTML = html;
        }
      })
      .catch(function () {});
  }

  function soon() {
    if (pending === null) {
      pending = window.setTimeout(refresh, 250);
    }
  }

  if (window.EventSource) {
    var events = new EventSource(eventsUrl);
    events.addEventListener("changed", soon);
    events.addEventListener("open", function () {
      if (live) {
        live.hidden = false;
      }
    });
    events.addEventListener("error", function () {
      if (live) {
        live.hidden = true;
      }
    });
  }
  // The time left changes even when nothing else does (and this is the fallback without events).
  window.setInterval(refresh, 30000);
})();
