// tiletune dashboard: draws every chart from the Plotly figure the page holds beside it, and
// draws it again when htmx swaps in fresh figure data (a live job page). No other script runs.
(function () {
  "use strict";
  var config = { responsive: true, displaylogo: false };

  function draw(root) {
    var charts = (root || document).querySelectorAll("div.chart[data-figure]");
    charts.forEach(function (el) {
      var source = document.getElementById(el.dataset.figure);
      if (!source || typeof Plotly === "undefined") { return; }
      var figure = JSON.parse(source.textContent);
      Plotly.react(el, figure.data, figure.layout, config);
    });
  }

  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  document.addEventListener("htmx:afterSettle", function () { draw(document); });
})();
