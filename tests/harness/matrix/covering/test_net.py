"""Coverage net of masking, the pure form (``net.extend``): rows added to a covering array until every tuple a judged
row can hold is held by one, each added row judged, and the tuples no judged row can hold named. Coverage is checked
by brute force, never with the generator's own checker."""
from __future__ import annotations

import itertools

from harness.matrix import covering
from harness.matrix.covering import net


def test_the_extension_adds_judged_rows_only_and_names_what_none_can_hold() -> None:
    """Pure form: three binary factors, pairwise, row (1, 1, x) masked: the added rows hold every pair but (1, 1)
    of factors 0 and 1, which no judged row can hold."""
    domains, allowed = [2, 2, 2], covering.Forbidden([2, 2, 2])
    rows = covering.covering_array(domains, 2, allowed)
    mask = [{0: [1], 1: [1]}]
    result = net.extend(rows, domains, 2, allowed, mask)
    assert result.masked == [((0, 1), (1, 1))]
    judged_rows = [row for row in [*rows, *result.added] if row[:2] != (1, 1)]
    pairs = {((f, row[f]), (g, row[g])) for row in judged_rows for f, g in itertools.combinations(range(3), 2)}
    everything = {((f, a), (g, b)) for f, g in itertools.combinations(range(3), 2) for a in (0, 1) for b in (0, 1)}
    assert everything - pairs == {((0, 1), (1, 1))}
    assert all(row[:2] != (1, 1) for row in result.added)
