"""Progress output on rank 0: a tqdm bar on a terminal, plain rate-limited lines in a batch log.

Each round shows the last evaluated test accuracy and loss (`-` before the first evaluation; `[round N]` when
they are from an earlier round than the one shown), and where the run measures them the test perplexity (`ppl`,
a next-token task, whose `acc` is the token accuracy), the mean local accuracy
(`local`, eval.local_every) and the backdoor's success rate (`backdoor`), then the seconds per round. Rounds
are 1-based. A long evaluation of the global model is announced before it starts and timed when it ends
(`evaluation`): when the previous one took EVAL_NOTICE_S or more, or, for the first, when the test set holds
EVAL_NOTICE_SAMPLES or more samples.

Progress is a courtesy: a broken pipe or a closed stderr silences it (`fedmpi.core.console`) and never changes
the run's outcome."""

from __future__ import annotations

import contextlib
import math
import sys
import time

from fedmpi.core import console

LINE_INTERVAL_S = 10.0
EVAL_NOTICE_S = 5.0             # an evaluation this long gets a line before the next one
EVAL_NOTICE_SAMPLES = 20_000    # ... and the first one on a test set this large
# (label, /metrics figure) shown live where the run measures it
LIVE = (("acc", "test_acc"), ("loss", "test_loss"), ("ppl", "test_perplexity"), ("local", "local_acc_mean"),
        ("backdoor", "backdoor_acc"))
ALWAYS = ("acc", "loss")        # shown as `-` before their first evaluation


class Progress:
    def __init__(self, total, start, mode="auto", stream=None, notice_s=EVAL_NOTICE_S,
                 notice_samples=EVAL_NOTICE_SAMPLES):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "lines"
        self.mode, self.total, self.start = mode, total, start
        self.notice_s, self.notice_samples = notice_s, notice_samples
        self.bar = None
        self.last = {}              # label -> (value, 0-based round it was measured in)
        self._eval_s = None         # how long the previous evaluation took
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

    def text(self, round_, metrics, sec_per_round):
        """The round's figures as shown (`round_` 0-based, as in /metrics)."""
        for label, name in LIVE:
            value = metrics.get(name, math.nan)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.last[label] = (float(value), round_)
        parts, earlier = [], None
        for label, _ in LIVE:
            if label in self.last:
                value, measured = self.last[label]
                parts.append(f"{label} {value:.4f}")
                if label in ALWAYS and measured != round_:
                    earlier = measured
            elif label in ALWAYS:
                parts.append(f"{label} -")
        if earlier is not None:
            parts.insert(len(ALWAYS), f"[round {earlier + 1}]")
        return "  ".join(parts + [f"{sec_per_round:.2f} s/round"])

    def update(self, round_, metrics, sec_per_round):
        """Round `round_`'s row (0-based, as in /metrics) is in the log: show it."""
        text = self.text(round_, metrics, sec_per_round)
        if self.bar is not None:
            self._guard(self._bar_step, text)
            return
        now = time.monotonic()
        last = round_ + 1 == self.total
        if self.mode == "lines" and (now - self._last_line >= LINE_INTERVAL_S or last):
            self._say(f"round {round_ + 1}/{self.total}  {text}")
            self._last_line = now

    @contextlib.contextmanager
    def evaluation(self, round_, samples):
        """Around rank 0's share of an evaluation of the global model on `samples` test samples in round
        `round_` (0-based): a line before it and one after it when it is expected to be long (module docstring)."""
        long = (self._eval_s >= self.notice_s) if self._eval_s is not None else samples >= self.notice_samples
        began = time.monotonic()
        if long and self.mode != "off":
            self._say(f"round {round_ + 1}/{self.total}  evaluating the global model on {samples} test samples"
                      + (f" (the last evaluation took {self._eval_s:.1f} s)" if self._eval_s is not None else ""))
        yield
        self._eval_s = time.monotonic() - began
        if long and self.mode != "off":
            self._say(f"round {round_ + 1}/{self.total}  evaluated in {self._eval_s:.1f} s")

    def _say(self, line):
        if self.bar is not None:
            self._guard(lambda: self.bar.write(line, file=self.stream))
        elif not console.say(line, self.stream):
            self.mode = "off"

    def _bar_step(self, text):
        self.bar.set_postfix_str(text, refresh=False)
        self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self._guard(self.bar.close)
            self.bar = None


class AnnouncedEvaluation:
    """Rank 0's evaluation of the global model (fedmpi.round.evaluation.SplitEvaluation), each `run` inside
    `progress.evaluation` for the round the loop sets in `round_`; everything else is the evaluation's own."""

    def __init__(self, evaluation, progress):
        self._evaluation, self._progress, self.round_ = evaluation, progress, 0

    def __getattr__(self, name):
        return getattr(self._evaluation, name)

    def run(self, vec):
        with self._progress.evaluation(self.round_, self._evaluation.n):
            return self._evaluation.run(vec)


def _isatty(stream):
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False
