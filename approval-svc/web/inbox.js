// Arbor inbox: live updates over server-sent events, countdowns and keyboard shortcuts.
// Plain script, no framework; every action is also a plain HTML form that works without it.
(function () {
  "use strict";

  function csrf() {
    var el = document.querySelector('input[name="csrf"]');
    return el ? el.value : "";
  }

  // ---- countdowns -------------------------------------------------------------------
  function human(ms) {
    var s = Math.max(0, Math.round(Math.abs(ms) / 1000));
    var parts = [];
    var d = Math.floor(s / 86400); s -= d * 86400;
    var h = Math.floor(s / 3600); s -= h * 3600;
    var m = Math.floor(s / 60); s -= m * 60;
    if (d) parts.push(d + "d");
    if (h) parts.push(h + "h");
    if (m) parts.push(m + "m");
    parts.push(s + "s");
    return parts.slice(0, 2).join(" ");
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("time.countdown").forEach(function (t) {
      var at = Date.parse(t.getAttribute("datetime"));
      if (isNaN(at)) return;
      var left = at - now;
      t.textContent = left > 0 ? "in " + human(left) : human(left) + " ago";
      t.classList.toggle("overdue", left <= 0);
    });
  }
  setInterval(tick, 1000);
  tick();

  // ---- live fragments ----------------------------------------------------------------
  var focusedId = null;
  function remember() {
    var checked = {};
    document.querySelectorAll('input[name="id"]:checked').forEach(function (c) { checked[c.value] = true; });
    return checked;
  }
  function restore(checked) {
    document.querySelectorAll('input[name="id"]').forEach(function (c) { if (checked[c.value]) c.checked = true; });
    if (focusedId) {
      var row = document.querySelector('.row[data-id="' + CSS.escape(focusedId) + '"]');
      if (row) { row.classList.add("focused"); }
    }
  }
  var busy = {};
  var last = {};
  function refocus() {
    if (!focusedId) return;
    var row = document.querySelector('.row[data-id="' + CSS.escape(focusedId) + '"]');
    var link = row && row.querySelector("a.title");
    if (link) link.focus();
  }
  function refresh(el) {
    var url = el.getAttribute("data-fragment") || el.getAttribute("data-load");
    if (!url || busy[url]) return;
    busy[url] = true;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (res) {
        if (res.status === 401) { window.location.assign("/sign-in"); return null; }
        return res.ok ? res.text() : null;
      })
      .then(function (html) {
        // Unchanged: left alone, so focus, selection and scrolling stay as they are.
        if (html === null || last[url] === html) return;
        last[url] = html;
        var checked = remember();
        var current = document.getElementById(el.id) || el;
        var hadFocus = current.contains(document.activeElement);
        if (current.hasAttribute("data-inner")) {
          current.innerHTML = html;
        } else {
          current.outerHTML = html;
        }
        restore(checked);
        if (hadFocus) refocus();
        tick();
      })
      .catch(function () {})
      .then(function () { busy[url] = false; });
  }
  var pending = null;
  var changed = {};
  var everything = false;
  function soon(e) {
    var id = null;
    try { id = JSON.parse(e.data).id; } catch (err) { id = null; }
    if (id) { changed[id] = true; } else { everything = true; }
    if (pending) return;
    pending = setTimeout(function () {
      pending = null;
      // An item's own part changes only with that item; queues and counts with any.
      document.querySelectorAll("[data-fragment]").forEach(function (el) {
        var own = el.getAttribute("data-id");
        if (!own || everything || changed[own]) refresh(el);
      });
      changed = {};
      everything = false;
    }, 30);
  }
  if (window.EventSource && document.querySelector("[data-fragment]")) {
    var es = new EventSource("/events");
    es.addEventListener("change", soon);
    es.addEventListener("reset", soon);
    es.onerror = function () {
      // The browser reconnects by itself (with Last-Event-ID); a lost session ends it.
      fetch("/fragments/counts", { credentials: "same-origin" }).then(function (r) {
        if (r.status === 401) { es.close(); window.location.assign("/sign-in"); }
      }).catch(function () {});
    };
  }
  // Parts that take the server longer (a run's events) arrive after the page, once.
  document.querySelectorAll("[data-load]").forEach(refresh);
  // Questions and external results come from the runner: refetched every second.
  setInterval(function () {
    if (document.hidden) return;
    document.querySelectorAll("[data-poll]").forEach(refresh);
  }, 1000);

  // ---- keyboard ------------------------------------------------------------------------
  function rows() { return Array.prototype.slice.call(document.querySelectorAll(".row")); }
  function focused() { return document.querySelector(".row.focused"); }
  function move(by) {
    var all = rows();
    if (!all.length) return;
    var i = all.indexOf(focused());
    var next = all[Math.max(0, Math.min(all.length - 1, i < 0 ? 0 : i + by))];
    all.forEach(function (r) { r.classList.remove("focused"); });
    next.classList.add("focused");
    focusedId = next.getAttribute("data-id");
    var link = next.querySelector("a.title");
    if (link) link.focus();
  }
  function post(action, fields) {
    var f = document.createElement("form");
    f.method = "post";
    f.action = action;
    Object.keys(fields).forEach(function (k) {
      var i = document.createElement("input");
      i.type = "hidden"; i.name = k; i.value = fields[k];
      f.appendChild(i);
    });
    document.body.appendChild(f);
    f.submit();
  }
  function help() {
    var d = document.getElementById("help");
    if (d && !d.open) d.showModal();
  }
  document.querySelectorAll(".help-open").forEach(function (b) { b.addEventListener("click", help); });
  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    var t = e.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable)) return;
    var row = focused();
    var decide = document.getElementById("decide");
    switch (e.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "?": help(); break;
      case "Enter":
        if (row && t === document.body) { window.location.assign(row.getAttribute("data-href")); } else { return; }
        break;
      case "a":
        if (decide) {
          var b = decide.querySelector('button[value="approve"]');
          if (b) b.click();
        } else if (row && row.getAttribute("data-href").indexOf("/items/") === 0) {
          post(row.getAttribute("data-href") + "/decide", {
            csrf: csrf(), decision: "approve", digest: row.getAttribute("data-digest") || ""
          });
        }
        break;
      case "r":
        if (decide) {
          var reason = document.getElementById("reason");
          if (reason) reason.focus();
        } else if (row) {
          window.location.assign(row.getAttribute("data-href") + "#reason");
        }
        break;
      case "e":
        var edit = document.querySelector('a[data-key="e"]');
        if (edit) { window.location.assign(edit.getAttribute("href")); }
        else if (row && row.getAttribute("data-href").indexOf("/items/") === 0) {
          window.location.assign(row.getAttribute("data-href") + "/edit");
        }
        break;
      default: return;
    }
    e.preventDefault();
  });
  // Arriving at an item with #reason (r from the queue): the reason is ready to type.
  if (window.location.hash === "#reason") {
    var reasonField = document.getElementById("reason");
    if (reasonField) reasonField.focus();
  }
})();
