// Keyboard shortcuts for people who work through queues (inbox, operations queue):
//   j / k      next / previous row (focus goes to the row's Review/Open link)
//   o, Enter   open the current row
//   a / r      on a review page: focus Approve / the rejection's reason (never submits)
//   /          focus the page's search or first filter
//   ?          list the shortcuts
// They never fire while typing in a field, nor with Ctrl, Alt or Meta held. What they do
// is said in the page's one live region (#live-announcer). Loaded from our own origin,
// no inline code (the Content-Security-Policy forbids it).
(function () {
  "use strict";

  var ROWS = "#inbox-list tbody tr, #queue-list tbody tr";
  var SEARCH = "[data-shortcut-search], main input[type=search], #inbox-filters select, #queue-filters select, #queue-filters input";
  var SHORTCUTS = [
    [["j"], "Next row"],
    [["k"], "Previous row"],
    [["o", "Enter"], "Open the current row"],
    [["a"], "On a review page: go to Approve (does not approve)"],
    [["r"], "On a review page: go to the rejection's reason (does not reject)"],
    [["/"], "Go to search or the filters"],
    [["?"], "Show this list"]
  ];

  var say = function (text) {
    var region = document.getElementById("live-announcer");
    if (!region) return;
    region.textContent = "";
    window.setTimeout(function () { region.textContent = text; }, 50);
  };

  var typing = function (el) {
    if (!el || el === document.body) return false;
    if (el.isContentEditable) return true;
    var tag = el.tagName;
    if (tag === "TEXTAREA" || tag === "SELECT") return true;
    if (tag !== "INPUT") return false;
    var kind = (el.getAttribute("type") || "text").toLowerCase();
    return ["button", "submit", "reset", "checkbox", "radio", "hidden"].indexOf(kind) === -1;
  };

  var rows = function () {
    return Array.prototype.slice.call(document.querySelectorAll(ROWS)).filter(function (row) {
      return row.querySelector("a[href]");
    });
  };

  var current = function (list) {
    var active = document.activeElement;
    for (var i = 0; i < list.length; i++) {
      if (list[i].contains(active) || list[i].classList.contains("row--current")) return i;
    }
    return -1;
  };

  var move = function (step) {
    var list = rows();
    if (!list.length) { say("No rows here."); return; }
    var at = current(list);
    var next = at === -1 ? (step > 0 ? 0 : list.length - 1) : Math.min(Math.max(at + step, 0), list.length - 1);
    list.forEach(function (row) { row.classList.remove("row--current"); });
    var row = list[next];
    row.classList.add("row--current");
    var link = row.querySelector("a[href]");
    link.focus();
    row.scrollIntoView({ block: "nearest" });
    say("Row " + (next + 1) + " of " + list.length + ".");
  };

  var open = function () {
    var list = rows();
    var at = current(list);
    if (at === -1) { say("No row chosen: press j to choose one."); return; }
    list[at].querySelector("a[href]").click();
  };

  var focusControl = function (ids, words) {
    for (var i = 0; i < ids.length; i++) {
      var el = document.getElementById(ids[i]);
      if (el && !el.disabled && el.offsetParent !== null) {
        el.focus();
        el.scrollIntoView({ block: "nearest" });
        say(words);
        return;
      }
    }
    say("Nothing to decide here.");
  };

  var dialog = null;
  var showHelp = function () {
    if (!dialog) {
      dialog = document.createElement("dialog");
      dialog.id = "shortcuts-dialog";
      dialog.className = "shortcuts";
      dialog.setAttribute("aria-labelledby", "shortcuts-h");
      var heading = document.createElement("h2");
      heading.id = "shortcuts-h";
      heading.textContent = "Keyboard shortcuts";
      dialog.appendChild(heading);
      var list = document.createElement("dl");
      SHORTCUTS.forEach(function (pair) {
        var key = document.createElement("dt");
        pair[0].forEach(function (name, n) {
          if (n) key.appendChild(document.createTextNode(" or "));
          var kbd = document.createElement("kbd");
          kbd.textContent = name;
          key.appendChild(kbd);
        });
        var what = document.createElement("dd");
        what.textContent = pair[1];
        list.appendChild(key);
        list.appendChild(what);
      });
      dialog.appendChild(list);
      var note = document.createElement("p");
      note.className = "muted small";
      note.textContent = "They do nothing while you type in a field.";
      dialog.appendChild(note);
      var close = document.createElement("button");
      close.type = "button";
      close.className = "button";
      close.textContent = "Close";
      close.addEventListener("click", function () { dialog.close(); });
      dialog.appendChild(close);
      document.body.appendChild(dialog);
    }
    if (!dialog.open) dialog.showModal();
  };

  var label = function () {
    var approve = document.getElementById("approve-button");
    if (approve) approve.setAttribute("aria-keyshortcuts", "a");
    var reason = document.getElementById("reject-reason");
    if (reason) reason.setAttribute("aria-keyshortcuts", "r");
    var search = document.querySelector(SEARCH);
    if (search) search.setAttribute("aria-keyshortcuts", "/");
  };
  document.addEventListener("DOMContentLoaded", label);
  document.addEventListener("htmx:afterSettle", label);

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
    if (typing(event.target)) return;
    if (dialog && dialog.open) return; // the dialog's own keys (Esc, Tab) only
    var key = event.key;
    if (key === "j") { move(1); }
    else if (key === "k") { move(-1); }
    else if (key === "o") { open(); }
    else if (key === "Enter" && event.target.tagName === "TR") { open(); }
    else if (key === "a") { focusControl(["approve-button"], "Approve button. Press Enter to approve, or Tab on."); }
    else if (key === "r") { focusControl(["reject-reason", "reject-button"], "Reason for rejecting. Write it, then Reject."); }
    else if (key === "/") {
      var search = document.querySelector(SEARCH);
      if (!search) { say("No search on this page."); }
      else { search.focus(); say("Search."); }
    }
    else if (key === "?") { showHelp(); }
    else { return; }
    event.preventDefault();
  });
})();
