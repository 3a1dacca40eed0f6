"""Known failures as the harness holds them (``[[expected]]``): declarations that together excuse every oracle mask
the cells they all match, on every machine, and nothing else."""
from __future__ import annotations

from harness import oracles
from harness.matrix.known import Expected, masks


def entry(number: int, when: dict, fails: tuple[str, ...], **kwargs: object) -> Expected:
    return Expected({f: tuple(levels) for f, levels in when.items()}, fails, "r", number=number, **kwargs)


def test_declarations_that_excuse_every_oracle_together_mask_the_cells_both_match() -> None:
    names = oracles.names()
    half = len(names) // 2
    first = entry(1, {"model": ["hybrid"]}, names[:half])
    second = entry(2, {"model": ["dense", "hybrid"], "spec": ["draft"]}, names[half:])
    (mask,) = masks([first, second], names)
    assert mask.numbers == (1, 2) and dict(mask.when) == {"model": ("hybrid",), "spec": ("draft",)}
    assert masks([first, entry(2, {"model": ["dense"]}, names[half:])], names) == ()  # no cell matches both
    assert masks([first], names) == ()


def test_a_cpu_bound_declaration_masks_on_every_machine() -> None:
    """Generated cells must not depend on the machine: a declaration that needs a CPU flag masks as if it were there."""
    (mask,) = masks([entry(3, {"model": ["hybrid"]}, ("error: SIGILL",), cpu=frozenset({"amx_tile"}))], oracles.names())
    assert mask.numbers == (3,)
