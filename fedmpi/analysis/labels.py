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
  ' vs ATTACK'  attack.name other than none
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


def method_label(config) -> str:
    """The label of the method a resolved config runs (see the module's docstring)."""
    if not isinstance(config, dict):
        return "?"
    label = algorithm_name(config)
    steps = _get(config, "eval.finetune_steps", 0)
    if steps:
        label += f"+ft{steps}"
    optimizer = _get(config, "server.optimizer", "sgd")
    if optimizer not in (None, "sgd"):
        label += f"+{optimizer}"
    aggregator = _get(config, "server.aggregator", "mean")
    if aggregator not in (None, "mean"):
        label += f"+{aggregator}"
    if _get(config, "server.weighting", "samples") == "uniform":
        label += "+uniform"
    if _get(config, "privacy.mechanism", "none") not in (None, "none"):
        clear = _get(config, "privacy.noise_multiplier") == 0 and _get(config, "privacy.target_epsilon") is None
        clip = _get(config, "privacy.clip")
        label += (f"+clip{clip:g}" if isinstance(clip, (int, float)) else f"+clip{clip}") if clear else "+dp"
    secure = _get(config, "server.secure_aggregation", "none")
    if secure not in (None, "none"):
        label += f"+{secure}"
    attack = _get(config, "attack.name", "none")
    if attack not in (None, "none"):
        label += f" vs {attack}"
    return label
