// Draw every chart from its JSON block, open a docs section when a link points at it,
// and sort tables by a clicked heading. Errors go to the console and to the chart's box.
(function () {
  document.querySelectorAll("div.chart[data-spec]").forEach(function (box) {
    var spec = JSON.parse(document.getElementById(box.dataset.spec).textContent);
    vegaEmbed(box, spec, { actions: false, renderer: "svg" }).then(function () {
      box.dataset.rendered = "yes";
    }).catch(function (error) {
      box.textContent = "This chart could not be drawn: " + error;
      console.error(error);
    });
  });
  function openTarget() {
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (target && target.tagName === "DETAILS") { target.open = true; }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
  document.querySelectorAll("table.sortable th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var body = th.closest("table").tBodies[0];
      var up = th.dataset.order !== "asc";
      th.closest("tr").querySelectorAll("th").forEach(function (h) { delete h.dataset.order; });
      th.dataset.order = up ? "asc" : "desc";
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[column].textContent.trim(), y = b.cells[column].textContent.trim();
        var nx = parseFloat(x.replace(/,/g, "")), ny = parseFloat(y.replace(/,/g, ""));
        var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return up ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
})();
