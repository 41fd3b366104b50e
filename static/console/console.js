// The console's only script: copy buttons, announcements and focus after htmx swaps.
// Loaded from our own origin; no inline code, no eval (see the Content-Security-Policy).
(function () {
  "use strict";

  // Copy the text of the element named by data-copy (the action digest).
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.textContent.trim();
    var status = button.parentElement.querySelector(".copy-status");
    var say = function (message) {
      if (status) status.textContent = message;
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

  // Parts that refresh themselves carry data-announce; when its text changes, say it in
  // the page's polite live region (a replaced live region is not reliably announced).
  var announced = {};
  var remember = function () {
    document.querySelectorAll("[data-announce][id]").forEach(function (el) {
      announced[el.id] = el.getAttribute("data-announce");
    });
  };
  document.addEventListener("DOMContentLoaded", remember);

  document.addEventListener("htmx:afterSettle", function (event) {
    var announcer = document.getElementById("live-announcer");
    document.querySelectorAll("[data-announce][id]").forEach(function (el) {
      var text = el.getAttribute("data-announce");
      if (announcer && announced[el.id] !== undefined && announced[el.id] !== text) {
        announcer.textContent = text;
      }
      announced[el.id] = text;
    });

    // After the reviewer's own decision, put focus where the result is shown.
    var config = event.detail && event.detail.requestConfig;
    if (config && config.verb && config.verb.toLowerCase() === "post") {
      var message = document.querySelector("#decision-message .notice");
      var heading = document.getElementById("decision-h");
      if (message) {
        message.setAttribute("tabindex", "-1");
        message.focus();
      } else if (heading) {
        heading.focus();
      }
    }
  });
})();
