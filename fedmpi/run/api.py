"""The in-process API: one experiment in this process, its figures returned instead of written to files.

    import fedmpi
    result = fedmpi.simulate("jobs/configs/quickstart.yaml", rounds=5, **{"algorithm.name": "fedprox"})
    result.metrics["test_acc"]        # one value per round, as /metrics/test_acc in run.h5
    result.clients["loss"]            # [round, client], as /clients/loss
    result.model                      # the final global model, a float32 vector

It runs the same Experiment and the same round loop as `fedmpi run` at -n 1 (no MPI, no run.h5, no
checkpoints), so a notebook or a test sees exactly what a run would log. A custom `dataset`
(fedmpi.data.Dataset), `model` (an nn.Module), client `parts` (index arrays into the training set) and
`loss` (a criterion on outputs and targets) replace what the config would build.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import yaml

from fedmpi import config as config_mod


@dataclass
class SimulationResult:
    metrics: dict          # name -> [round] array (NaN where not measured), or [round, k] for rows, as /metrics
    clients: dict          # name -> [round, client] array, as /clients
    model: np.ndarray      # the final global flat vector
    timing: np.ndarray = None   # [round, rank, phase] seconds, as /timing (fedmpi.core.timing.PHASES)
    experiment: object = field(repr=False, default=None)   # the Experiment, for inspection


class MemoryLog:
    """Collects the rows the run loop would append to run.h5."""

    def __init__(self):
        self.rows, self.client_rows, self.timing_rows = [], [], []
        self.attrs = {}         # what the run would set as run.h5's attributes while it goes

    def set_attrs(self, **attrs):
        self.attrs.update(attrs)

    def append(self, metrics, clients=None, num_clients=None, timing=None):
        self.rows.append(dict(metrics))
        self.client_rows.append(dict(clients or {}))
        self.timing_rows.append(timing)

    def append_rows(self, rows, num_clients=None):
        """`append` for each fedmpi.io.store.LogRow, in order (the run loop writes rows in batches)."""
        for row in rows:
            self.append(row.metrics, row.clients, num_clients, row.timing)

    def metrics(self):
        names = dict.fromkeys(k for row in self.rows for k in row)
        return {k: _column([row.get(k) for row in self.rows]) for k in names}

    def clients(self):
        """name -> [round, client]; a figure missing from a round's row (local_acc outside local evaluations)
        is NaN there, as in run.h5."""
        names = dict.fromkeys(k for row in self.client_rows for k in row)
        out = {}
        for k in names:
            width = next(len(row[k]) for row in self.client_rows if k in row)
            out[k] = np.stack([row[k] if k in row else np.full(width, np.nan, dtype=np.float32)
                               for row in self.client_rows])
        return out

    def timing(self):
        return np.stack(self.timing_rows) if self.timing_rows else np.zeros((0, 1, 0))


def _column(values):
    """One metric over the rounds: floats (NaN where missing), text (model_sha256), or rows [round, k]."""
    present = [v for v in values if v is not None]
    if present and isinstance(present[0], str):
        return np.array([v or "" for v in values])
    if present and np.ndim(present[0]) == 1:
        width = len(present[0])
        return np.stack([np.full(width, np.nan) if v is None else np.asarray(v, dtype=np.float64) for v in values])
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def as_config(cfg, overrides=None):
    """A Config from a Config, a mapping or a YAML path, with dotted `key: value` overrides applied."""
    overrides = [_override_text(k, v) for k, v in (overrides or {}).items()]
    if isinstance(cfg, config_mod.Config):
        if not overrides:
            return cfg
        cfg = cfg.to_dict()
    if isinstance(cfg, dict):
        return config_mod.from_dict(config_mod.apply_overrides(cfg, overrides))
    return config_mod.load(str(cfg), overrides)


def _override_text(key, value):
    """`key=value` whose YAML reading (config.apply_overrides) gives back `value` exactly: a plain f-string
    would turn the string 'off' into false and the float 1e-05 into a string."""
    return f"{key}={yaml.safe_dump(value, default_flow_style=True, width=float('inf'))}"


def simulate(cfg, *, dataset=None, model=None, parts=None, loss=None, rounds=None, **overrides):
    """Runs the experiment of `cfg` (Config, mapping or YAML path; `rounds` and dotted overrides such as
    `**{"client.lr": 0.1}` applied) in this process and returns a SimulationResult."""
    from fedmpi.mpi.local import LocalComm
    from fedmpi.run.launch import _loop
    from fedmpi.run.setup import experiment

    cfg = as_config(cfg, overrides)
    if rounds is not None:
        cfg = dataclasses.replace(cfg, rounds=int(rounds))
    comm = LocalComm()
    exp = experiment(cfg, comm, dataset=dataset, model=model, parts=parts, loss=loss)
    log = MemoryLog()
    _loop(cfg, comm, exp, log, checkpoints=False)
    return SimulationResult(log.metrics(), log.clients(), exp.global_model(), log.timing(), exp)
