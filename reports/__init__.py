"""Reports of kvmatrix runs: the HTML page (generated files go to reports/out/)."""
