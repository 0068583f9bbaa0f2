// stashpoint web UI: the live view of a session's graph and small conveniences.
// Every page works without this file; it only adds. No network beyond this server.
"use strict";

(function () {
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function cell(child) {
    var td = el("td");
    if (child) { td.appendChild(child); }
    return td;
  }

  function row(cp) {
    var tr = el("tr", { id: "r-" + cp.id, "class": "fresh" });
    tr.appendChild(cell(el("input", { type: "radio", name: "a", value: cp.id, "aria-label": "A" })));
    tr.appendChild(cell(el("input", { type: "radio", name: "b", value: cp.id, "aria-label": "B" })));
    tr.appendChild(cell(el("span", { "class": "newdot", title: "new" }, "●")));
    var id = cell(el("a", { "class": "id", href: cp.url }, cp.short));
    id.appendChild(el("span", { "class": "branch" }, cp.branch));
    if (cp.label) { id.appendChild(el("span", { "class": "label" }, cp.label)); }
    tr.appendChild(id);
    tr.appendChild(el("td", { "class": "kind" }, cp.kind));
    tr.appendChild(el("td", {}, cp.step));
    tr.appendChild(el("td", { "class": "muted" }, cp.time));
    tr.appendChild(el("td", { "class": "msg" }, cp.message));
    return tr;
  }

  function live(table) {
    var status = document.getElementById("live-status");
    var name = table.getAttribute("data-session");
    var base = "/s/" + encodeURIComponent(name) + "/live.json?after=";
    var body = table.tBodies[0];
    var added = 0;
    var busy = false;
    function poll() {
      if (busy) { return; }
      busy = true;
      var after = table.getAttribute("data-newest") || "";
      fetch(base + encodeURIComponent(after), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          busy = false;
          if (!data) { return; }
          var fresh = data["new"].filter(function (x) { return !x.more; });
          if (fresh.length) {
            for (var i = fresh.length - 1; i >= 0; i--) {
              if (!document.getElementById("r-" + fresh[i].id)) {
                body.insertBefore(row(fresh[i]), body.firstChild);
                added++;
              }
            }
            table.setAttribute("data-newest", fresh[0].id);
          }
          var more = data["new"].some(function (x) { return x.more; });
          if (status) {
            status.textContent = "live" + (added ? " · " + added + " new checkpoint(s) since the page loaded" : "") +
              (more ? " · more than a page arrived: reload" : "") + (added ? " · reload to draw them in the graph" : "");
          }
        })
        .catch(function () { busy = false; if (status) { status.textContent = "live view paused (server unreachable)"; } });
    }
    if (status) { status.textContent = "live"; }
    window.setInterval(poll, 1500);
  }

  function picks(form) {
    form.addEventListener("submit", function (ev) {
      var a = form.querySelector("input[name=a]:checked");
      var b = form.querySelector("input[name=b]:checked");
      if (!a || !b) {
        ev.preventDefault();
        var status = document.getElementById("live-status");
        if (status) { status.textContent = "pick a checkpoint in column A and one in column B"; }
      }
    });
    form.addEventListener("change", function () {
      Array.prototype.forEach.call(form.querySelectorAll("tr.picked"), function (tr) { tr.classList.remove("picked"); });
      Array.prototype.forEach.call(form.querySelectorAll("input:checked"), function (input) {
        var tr = input.closest("tr");
        if (tr) { tr.classList.add("picked"); }
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("graph");
    if (table && table.getAttribute("data-live") === "1") { live(table); }
    var form = document.getElementById("graph-form");
    if (form) { picks(form); }
  });
})();
