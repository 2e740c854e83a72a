"""Perplexity of a next-token task, derived from the recorded cross-entropy by one function.

A next-token task (LEAF's Shakespeare: 80 characters in, the next character out, for the zoo's `lstm` and for
`causal_lm` alike) is a classification over the vocabulary, so its accuracy is the token accuracy and its mean
test cross-entropy (nats per predicted token) gives the perplexity exp(mean cross-entropy): the figure language
models are compared by, where a lower value is better. run.h5 records it beside the loss it comes from
(/metrics/test_perplexity from test_loss; /metrics/local_perplexity_mean from local_loss_mean, the
sample-weighted mean over the clients' own test splits, so the pooled perplexity of their test tokens), only
for such a task and only where the loss is the model's cross-entropy (a criterion given to the Python API may
be anything, and exp of it would be no perplexity).
"""

from __future__ import annotations

import math
import numbers

# Data sets whose samples are next-token predictions over a vocabulary (their classes are its tokens).
NEXT_TOKEN_DATA = frozenset({"shakespeare"})
# The model that is a next-token classifier on any data (fedmpi.core.causal_lm)
CAUSAL_LM = "causal_lm"
# /metrics figure -> the recorded mean cross-entropy it is exp of
FROM_LOSS = {"test_perplexity": "test_loss", "local_perplexity_mean": "local_loss_mean"}


def perplexity(mean_cross_entropy) -> float:
    """exp(mean cross-entropy in nats): infinite past float64's range (a loss above ~709.78), NaN for NaN."""
    value = float(mean_cross_entropy)
    if math.isnan(value):
        return math.nan
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf


def records_perplexity(data_name, model_name=None, custom_loss=False) -> bool:
    """Whether a run on data set `data_name` with model `model_name` records perplexity: a next-token task (a
    next-token data set, or any data under `causal_lm`, whose classes are its vocabulary: instruction data from
    tools/tokenize_instructions.py through `data.name: arrays`) evaluated with cross-entropy."""
    return (data_name in NEXT_TOKEN_DATA or model_name == CAUSAL_LM) and not custom_loss


def perplexity_figures(metrics) -> dict:
    """{figure: value} of FROM_LOSS for the losses that the round's /metrics row `metrics` holds."""
    return {name: perplexity(metrics[loss]) for name, loss in FROM_LOSS.items()
            if isinstance(metrics.get(loss), numbers.Real)}
