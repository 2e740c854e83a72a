"""Runs a rule (fedmpi.robust.rules) over a source of chunks, with an omniscient attack's passes first.

`source(lo, hi)` gives the [n, hi - lo] float32 rows of the round's counted clients for the coordinates
[lo, hi) (on rank 0: the chunked gather; in tests: slices of a matrix). Every chunk is visited in order in
each pass; the attack (an object with `passes`, `prepare(sweep)` and `craft(lo, hi, rows)`, e.g.
fedmpi.attacks.omniscient) first runs its own passes over the true rows, then replaces the malicious rows
of every chunk the rule sees. The number of sweeps is checked against what the rule and the attack
declared: the other ranks iterate the declared schedule, so a rule that sweeps otherwise is a bug.
"""

from __future__ import annotations

from fedmpi.robust.chunks import BLOCK, chunk_bounds


def total_passes(rule, attack=None) -> int:
    return rule.passes() + (attack.passes if attack is not None else 0)


def aggregate_chunks(rule, source, weights, dim, width, *, block=BLOCK, attack=None, server_update=None):
    """The rule's Outcome over the chunks of `width` coordinates (a multiple of `block`)."""
    if width % block and width < dim:
        raise ValueError(f"chunk width {width} is not a multiple of the block {block}")
    bounds = chunk_bounds(dim, width)
    declared = total_passes(rule, attack)
    done = [0]

    def sweeper(craft):
        def sweep(visit):
            if done[0] >= declared:
                raise RuntimeError(f"aggregator {rule.name!r} swept more than its {declared} declared passes")
            done[0] += 1
            for lo, hi in bounds:
                rows = source(lo, hi)
                if craft is not None:
                    craft(lo, hi, rows)
                visit(lo, hi, rows)
        return sweep

    if attack is not None:
        attack.prepare(sweeper(None))
    outcome = rule.aggregate(sweeper(attack.craft if attack is not None else None), weights, dim, block,
                             server_update)
    if done[0] != declared:
        raise RuntimeError(f"aggregator {rule.name!r} swept {done[0]} times, declared {declared}")
    return outcome
