"""Progress output on rank 0: a tqdm bar on a terminal, plain rate-limited lines in a batch log."""

from __future__ import annotations

import math
import sys
import time

LINE_INTERVAL_S = 10.0


class Progress:
    def __init__(self, total, start, mode="auto", stream=None):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode, self.total, self.start = mode, total, start
        self.bar = None
        self.acc = self.loss = math.nan
        self._last_line = -math.inf
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="round", file=self.stream, dynamic_ncols=True)

    def update(self, round_, acc, loss, sec_per_round):
        """`acc`/`loss` are NaN in rounds without evaluation; the last evaluated values are shown."""
        if not math.isnan(acc):
            self.acc, self.loss = acc, loss
        acc, loss = self.acc, self.loss
        text = f"acc {acc:.4f}  loss {loss:.4f}  {sec_per_round:.2f} s/round"
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
            return
        now = time.monotonic()
        last = round_ + 1 == self.total
        if self.mode == "lines" and (now - self._last_line >= LINE_INTERVAL_S or last):
            print(f"round {round_ + 1}/{self.total}  {text}", file=self.stream, flush=True)
            self._last_line = now

    def close(self):
        if self.bar is not None:
            self.bar.close()
