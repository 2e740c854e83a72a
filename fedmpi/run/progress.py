"""Progress output on rank 0: a tqdm bar on a terminal, plain rate-limited lines in a batch log.

Progress is a courtesy: a broken pipe or a closed stderr silences it (`fedmpi.core.console`) and never changes
the run's outcome."""

from __future__ import annotations

import math
import sys
import time

from fedmpi.core import console

LINE_INTERVAL_S = 10.0


class Progress:
    def __init__(self, total, start, mode="auto", stream=None):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "lines"
        self.mode, self.total, self.start = mode, total, start
        self.bar = None
        self.acc = self.loss = math.nan
        self._last_line = -math.inf
        if self.stream is None:
            self.mode = "off"
        elif mode == "bar":
            self._guard(self._open_bar)

    def _open_bar(self):
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, initial=self.start, unit="round", file=self.stream, dynamic_ncols=True)

    def _guard(self, fn, *args):
        """Runs one write of the bar; a failed one (the terminal or pipe went away) ends the progress output."""
        try:
            fn(*args)
        except (OSError, ValueError):
            console.silence(self.stream)
            self.bar, self.mode = None, "off"

    def update(self, round_, acc, loss, sec_per_round):
        """`acc`/`loss` are NaN in rounds without evaluation; the last evaluated values are shown."""
        if not math.isnan(acc):
            self.acc, self.loss = acc, loss
        acc, loss = self.acc, self.loss
        text = f"acc {acc:.4f}  loss {loss:.4f}  {sec_per_round:.2f} s/round"
        if self.bar is not None:
            self._guard(self._bar_step, text)
            return
        now = time.monotonic()
        last = round_ + 1 == self.total
        if self.mode == "lines" and (now - self._last_line >= LINE_INTERVAL_S or last):
            if not console.say(f"round {round_ + 1}/{self.total}  {text}", self.stream):
                self.mode = "off"
            self._last_line = now

    def _bar_step(self, text):
        self.bar.set_postfix_str(text, refresh=False)
        self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self._guard(self.bar.close)
            self.bar = None


def _isatty(stream):
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False
