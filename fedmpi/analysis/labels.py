"""A run's method label: its algorithm with what else makes it a different method, so that no two different
methods share a label (and a grouped summary never merges them): FedAvg with fine-tuning before the local
evaluation is `fedavg+ft10`, not `fedavg`.

The parts, in this order, each only where it differs from plain training:
  +ftN          eval.finetune_steps = N local steps before each local evaluation (FedAvg+FT)
  +OPT          server.optimizer other than sgd (adam, yogi, avgm, ...: FedAdam is fedavg+adam)
  +AGG          server.aggregator other than the weighted mean (median, krum, trimmed_mean, fltrust, ...)
  +uniform      server.weighting: uniform (every client weighs 1)
  +dp           privacy.mechanism gaussian with noise (client-level differential privacy)
  +clipC        privacy.mechanism gaussian with noise_multiplier 0 and no target_epsilon: updates clipped to L2
                norm C in the clear, uniform weights, no noise (the clear-text twin of secure aggregation)
  +secagg       server.secure_aggregation: secagg or secagg_plus (+secagg_plus)
  +weighted     secagg.weighting: samples (weighted secure aggregation)
  ' vs ATTACK'  attack.name other than none
  ' drop [K]', ' remove [K]'   a counterfactual's clients (counterfactual.drop, counterfactual.remove)
Hyperparameters of the algorithm itself (FSL's gamma, FedProx's mu) are not in the label: they are a sweep's
keys, grouped by `--by algorithm.gamma` (a summary says when a group mixes runs that differ in them).
"""

from __future__ import annotations


def _get(config, dotted, default=None):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def algorithm_name(config):
    algorithm = config.get("algorithm") if isinstance(config, dict) else None
    return str(algorithm.get("name", "?") if isinstance(algorithm, dict) else algorithm or "?")


# (key, the value that adds nothing, how a value reads in the label), in the label's order (the docstring's)
PARTS = (("eval.finetune_steps", 0, "+ft{}"), ("server.optimizer", "sgd", "+{}"), ("server.aggregator", "mean", "+{}"),
         ("server.weighting", "samples", "+{}"), ("privacy.mechanism", "none", None),
         ("server.secure_aggregation", "none", "+{}"), ("secagg.weighting", "uniform", "+weighted"),
         ("attack.name", "none", " vs {}"), ("counterfactual.drop", [], " drop {}"),
         ("counterfactual.remove", [], " remove {}"))


def _privacy(config):
    """+dp, or +clipC for the clear-text twin of secure aggregation (clip, no noise, no target epsilon)."""
    clear = _get(config, "privacy.noise_multiplier") == 0 and _get(config, "privacy.target_epsilon") is None
    clip = _get(config, "privacy.clip")
    return (f"+clip{clip:g}" if isinstance(clip, (int, float)) else f"+clip{clip}") if clear else "+dp"


def method_label(config) -> str:
    """The label of the method a resolved config runs (see the module's docstring)."""
    if not isinstance(config, dict):
        return "?"
    label = algorithm_name(config)
    for key, plain, form in PARTS:
        value = _get(config, key, plain)
        if value not in (None, plain):
            label += _privacy(config) if form is None else form.format(value)
    return label
