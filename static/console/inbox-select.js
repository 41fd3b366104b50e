// The inbox's selection for bulk review (/reviews/bulk/): the ticked requests survive the
// list's refresh by its poll or a filter change, and the button says how many are ticked.
// Without JavaScript the checkboxes and the button work as a plain GET form.
(function () {
  "use strict";
  var kept = [];

  function boxes() {
    return Array.prototype.slice.call(document.querySelectorAll('input[name="ids"][form="inbox-bulk"]'));
  }

  function update() {
    var form = document.getElementById("inbox-bulk");
    if (!form) return;
    var max = parseInt(form.getAttribute("data-bulk-max"), 10) || 50;
    var ticked = boxes().filter(function (box) { return box.checked; });
    var tools = {};
    ticked.forEach(function (box) { tools[box.getAttribute("data-tool")] = true; });
    var button = document.getElementById("review-selected");
    var count = document.getElementById("bulk-count");
    var several = Object.keys(tools).length > 1;
    button.disabled = ticked.length === 0 || ticked.length > max || several;
    button.textContent = ticked.length ? "Review selected (" + ticked.length + ")" : "Review selected";
    if (several) {
      count.textContent = "Select requests of one tool: a bulk review decides one tool's requests.";
    } else if (ticked.length > max) {
      count.textContent = "At most " + max + " at a time: " + ticked.length + " are ticked.";
    } else {
      count.textContent = ticked.length + " of at most " + max + " selected.";
    }
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (target && target.id === "inbox-list") {
      kept = boxes().filter(function (box) { return box.checked; }).map(function (box) { return box.value; });
    }
  });
  document.addEventListener("htmx:afterSettle", function () {
    boxes().forEach(function (box) { if (kept.indexOf(box.value) !== -1) box.checked = true; });
    kept = [];
    update();
  });
  document.addEventListener("change", function (event) {
    if (event.target && event.target.matches('input[name="ids"]')) update();
  });
  document.addEventListener("DOMContentLoaded", update);
})();
