"""Walk-through 3 of docs/how-to/own-algorithm.md: a robust aggregator in one file, run by
`server.aggregator: examples.meamed:MeanAroundMedian`.

MeaMed (Xie, Koyejo and Gupta 2018, "Generalized Byzantine-tolerant SGD"): per coordinate, the mean of the
n - f values closest to the coordinate-wise median. With f = 0 it is the unweighted mean of the updates.
"""

import numpy as np

from fedmpi.robust.rules import Outcome, Rule


class MeanAroundMedian(Rule):
    name = "meamed"
    uses = ("f",)           # reads server.robust.f; any other server.robust key set is refused

    def passes(self):
        return 1            # one sweep over the chunks of the round's update matrix

    def aggregate(self, sweep, w, dim, block, server_update=None):
        n = len(w)
        keep = n - min(self.keys.f, n - 1)      # a round too small for f keeps one value
        out, counted = np.empty(dim), np.zeros(n)

        def visit(lo, hi, rows):
            # rows: [n, hi - lo] float32, the counted clients' updates in client-id order
            r = rows.astype(np.float64)
            median = np.median(r, axis=0)
            nearest = np.argsort(np.abs(r - median), axis=0, kind="stable")[:keep]
            out[lo:hi] = np.take_along_axis(r, nearest, axis=0).mean(axis=0)
            counted[:] += np.bincount(nearest.ravel(), minlength=n)

        sweep(visit)
        # each client's share of the aggregate: the share of the (coordinate, value) pairs it gave
        return Outcome(out, counted / counted.sum())
