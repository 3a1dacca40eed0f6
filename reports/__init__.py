"""Reports of kvmatrix runs, rendered from the record (harness.results): the HTML page, compare page, JUnit XML."""
