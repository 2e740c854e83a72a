"""MLflow: a run in experiment `runtime.tracking_project` (default: the run folder's name) of the tracking
store `runtime.tracking_uri` (default: a local file store, OUT/mlruns; `mlflow ui --backend-store-uri
OUT/mlruns`). Works with `mlflow-skinny` (pip install 'fedmpi[mlflow]').

MLflow 3 keeps its file store only on request: fedmpi sets MLFLOW_ALLOW_FILE_STORE=true (unless already set)
when the store is a `file:` URI or a path. For a server, an unset MLFLOW_HTTP_REQUEST_MAX_RETRIES and
MLFLOW_HTTP_REQUEST_TIMEOUT are set to 0 and 10 s, so an unreachable server drops the tracker within seconds
instead of retrying for minutes while the run waits.

MLflow has no histograms: each per-client figure is logged as `clients/NAME/min|q25|median|q75|max|mean`.
--resume logs into the same MLflow run (its id is in run.h5's `tracking_mlflow`); rounds the resumed run
recomputes are logged again at the same steps (MLflow keeps every value of a step; the newest is last)."""

from __future__ import annotations

import os
import pathlib
from urllib.parse import urlparse

from fedmpi.io import series
from fedmpi.run.tracking import Tracker

FOLDER = "mlruns"
BATCH = 1000            # MLflow's limit of metrics in one log_batch call
PARAM_BATCH = 100       # ... and of params
PARAM_CHARS = 6000      # ... and of one param value's length
STATUS = {"finished": "FINISHED", "preempted": "KILLED", "interrupted": "KILLED"}     # otherwise FAILED


def store_uri(cfg, out):
    uri = cfg.runtime.tracking_uri
    if uri is None:
        return pathlib.Path(out, FOLDER).as_uri()
    return uri


def _is_file_store(uri):
    return urlparse(uri).scheme in ("", "file")


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, cfg, out, previous):
        uri = store_uri(cfg, out)
        if _is_file_store(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        else:
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric, self._param = Metric, Param
        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        run = self._existing(previous)
        if run is None:
            project = cfg.runtime.tracking_project or os.path.basename(out)
            found = self.client.get_experiment_by_name(project)
            experiment = found.experiment_id if found else self.client.create_experiment(project)
            run = self.client.create_run(experiment, run_name=os.path.basename(out),
                                         tags={"fedmpi.out": out, "fedmpi.config_hash": cfg.hash()})
            if previous:
                self.note = f"run {previous} is not in {uri}; the resumed run is logged as a new run {run.info.run_id}"
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
        self.resumed = run.info.run_id == previous
        self.identity = run.info.run_id

    def _existing(self, previous):
        if not previous:
            return None
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(previous)
        except MlflowException:
            return None

    def log_params(self, params):
        if self.resumed:            # MLflow refuses to log a param again (and the config may differ in runtime)
            return
        items = [self._param(k, str(v)[:PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), PARAM_BATCH):
            self.client.log_batch(self.identity, params=items[i:i + PARAM_BATCH])

    def log_round(self, step, scalars, clients, wall_time):
        ms = int(wall_time * 1000)
        points = [self._metric(tag, value, ms, step) for tag, value in scalars]
        for tag, row in clients.items():
            points += [self._metric(f"{tag}/{k}", v, ms, step) for k, v in series.quantiles(row).items()]
        for i in range(0, len(points), BATCH):
            self.client.log_batch(self.identity, metrics=points[i:i + BATCH])

    def close(self, status):
        self.client.set_terminated(self.identity, STATUS.get(status, "FAILED"))

    def abandon(self):
        self.client.set_terminated(self.identity, "FAILED")
