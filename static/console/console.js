// The console's only script: copy buttons, announcements and focus after htmx swaps.
// Loaded from our own origin; no inline code, no eval (see the Content-Security-Policy).
(function () {
  "use strict";

  // --- the page's one live region ---------------------------------------------------
  // Every page has exactly one polite live region, #live-announcer (base.html). Nothing
  // else on a page is a live region: what changes says so here, once.

  var lastSaid = "";
  var announce = function (text) {
    var region = document.getElementById("live-announcer");
    text = (text || "").replace(/\s+/g, " ").trim();
    if (!region || !text) return;
    if (text === lastSaid && region.textContent === text) {
      // The same words again (a second copy): clear first, or nothing is read out.
      region.textContent = "";
      window.setTimeout(function () { region.textContent = text; }, 100);
    } else {
      region.textContent = text;
    }
    lastSaid = text;
  };

  var sentence = function (text) {
    text = (text || "").trim();
    return !text || /[.!?…]$/.test(text) ? text : text + ".";
  };

  // Copy the text of the element named by data-copy (the action digest, a new key).
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.textContent.trim();
    var status = button.parentElement.querySelector(".copy-status");
    var say = function (message) {
      if (status) status.textContent = message;
      announce(message);
    };
    var selectSource = function () {
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { say("Copied"); },
        function () { selectSource(); say("Selected: press Ctrl+C to copy"); }
      );
    } else {
      selectSource();
      say("Selected: press Ctrl+C to copy");
    }
  });

  // Parts that refresh themselves describe what they show in attributes:
  //   data-announce           their state ("Token delivered", "3 pending review"): said
  //                           when it changes;
  //   data-announce-security  security events ("1 replay refused"): said when they change;
  //   data-announce-notice    the answer to the reader's own action: said when it comes
  //                           (a poll never carries one).
  // Each settled swap is said at most once, as one message.
  var SOURCES = "[id][data-announce], [id][data-announce-security], [id][data-announce-notice]";
  var known = {};
  var read = function (el) {
    return {
      state: el.getAttribute("data-announce") || "",
      security: el.getAttribute("data-announce-security") || "",
      notice: el.getAttribute("data-announce-notice") || ""
    };
  };
  var sources = function (root) {
    var found = Array.prototype.slice.call(root.querySelectorAll(SOURCES));
    if (root.matches && root.matches(SOURCES)) found.unshift(root);
    return found;
  };
  var rememberAll = function () {
    sources(document).forEach(function (el) { known[el.id] = read(el); });
  };

  document.addEventListener("DOMContentLoaded", function () {
    rememberAll();
    // Messages that came with the page (after a redirect) are said once it has loaded:
    // content present at load is not announced by a live region.
    var parts = [];
    document.querySelectorAll("[data-announce-load]").forEach(function (el) {
      parts.push(sentence(el.textContent));
    });
    document.querySelectorAll("[data-announce-notice]").forEach(function (el) {
      parts.push(sentence(el.getAttribute("data-announce-notice")));
    });
    if (parts.length) {
      window.setTimeout(function () { announce(parts.join(" ")); }, 250);
    }
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    var root = event.target;
    if (!root || !root.querySelectorAll) return;
    var parts = [];
    sources(root).forEach(function (el) {
      var now = read(el);
      var before = known[el.id];
      known[el.id] = now;
      if (now.notice) parts.push(sentence(now.notice));
      if (before === undefined) return; // a part that just appeared: nothing changed
      if (now.state && now.state !== before.state) {
        // "Approved. The approval is issued…" already says "Approved": once is enough.
        if (!now.notice || now.notice.indexOf(now.state) !== 0) parts.push(sentence(now.state));
      }
      if (now.security && now.security !== before.security) parts.push(sentence(now.security));
    });
    if (parts.length) announce(parts.join(" "));
  });

  // --- tables that scroll sideways ---------------------------------------------------
  // A table wider than its box (at 200% zoom, say) scrolls inside .table-wrap. A keyboard
  // can scroll it only if the box takes focus, so it does, named after its section,
  // while it overflows (and only then: no extra tab stop when the table fits).

  var markScrollables = function () {
    document.querySelectorAll(".table-wrap").forEach(function (wrap) {
      if (wrap.scrollWidth > wrap.clientWidth + 1) {
        if (wrap.getAttribute("tabindex") === "0") return;
        var section = wrap.closest("[aria-labelledby]");
        var heading = section && document.getElementById(section.getAttribute("aria-labelledby"));
        wrap.setAttribute("tabindex", "0");
        wrap.setAttribute("role", "group");
        wrap.setAttribute("aria-label", ((heading && heading.textContent.replace(/\s+/g, " ").trim()) || "Table") + ", scrolls sideways");
      } else if (wrap.getAttribute("tabindex") === "0") {
        wrap.removeAttribute("tabindex");
        wrap.removeAttribute("role");
        wrap.removeAttribute("aria-label");
      }
    });
  };
  var resizing = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizing);
    resizing = window.setTimeout(markScrollables, 150);
  });
  document.addEventListener("DOMContentLoaded", markScrollables);
  document.addEventListener("htmx:afterSettle", markScrollables);

  // --- times in the reader's zone ----------------------------------------------------
  // The server writes UTC (it does not know the reader's zone); a <time class="local-time">
  // is rewritten in the browser's own zone, its title keeping the UTC it came with.

  var localTimes = function (root) {
    if (!window.Intl || !root.querySelectorAll) return;
    var format = new Intl.DateTimeFormat(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", timeZoneName: "short"
    });
    root.querySelectorAll("time.local-time[datetime]").forEach(function (el) {
      var moment = new Date(el.getAttribute("datetime"));
      if (!isNaN(moment.getTime())) el.textContent = format.format(moment);
    });
  };
  document.addEventListener("DOMContentLoaded", function () { localTimes(document); });
  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.target) localTimes(event.target.parentElement || document);
  });

  // --- focus across swaps -----------------------------------------------------------
  // htmx puts focus back on an element with the same id after a swap. When the focused
  // control is gone (its row left the inbox, the Approve button after a decision), focus
  // goes to its replacement instead of falling to <body>: the control in the same place
  // of the same group (data-focus-group), else the part's data-focus-fallback.

  var pending = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    pending = null;
    var target = event.detail && event.detail.target;
    var active = document.activeElement;
    if (!target || !active || active === document.body || !target.contains(active)) return;
    var group = active.getAttribute("data-focus-group") || "";
    var members = group
      ? Array.prototype.slice.call(target.querySelectorAll('[data-focus-group="' + group + '"]'))
      : [];
    pending = {
      id: active.id || "",
      targetId: target.id || "",
      group: group,
      index: members.indexOf(active)
    };
  });

  var focusLost = function () {
    var active = document.activeElement;
    return !active || active === document.body || active === document.documentElement;
  };

  document.addEventListener("htmx:afterSwap", function () {
    var was = pending;
    pending = null;
    if (!was || !focusLost()) return;
    var next = was.id ? document.getElementById(was.id) : null;
    var part = was.targetId ? document.getElementById(was.targetId) : null;
    if (!next && part && was.group) {
      var members = part.querySelectorAll('[data-focus-group="' + was.group + '"]');
      if (members.length) next = members[Math.min(Math.max(was.index, 0), members.length - 1)];
    }
    if (!next && part) {
      next = part.matches("[data-focus-fallback]") ? part : part.querySelector("[data-focus-fallback]");
    }
    if (next) next.focus({ preventScroll: true });
  });
})();
