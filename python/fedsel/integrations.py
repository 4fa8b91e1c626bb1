"""Experiment-tracker callbacks for ``fedsel.run(..., on_round=...)`` and
``FedselStrategy(..., on_round=...)``.

Each callback takes one round's record (a dict of metric name -> value) and logs its
numbers at the record's ``round`` as the step; empty cells (``None``) and values that are
not numbers are left out. The trackers are optional dependencies, imported only when a
callback is made: ``pip install wandb`` or ``pip install mlflow`` (``mlflow-skinny`` is
enough). Call the callback's ``finish()`` when the run is over, to close the tracker's run.

::

    from fedsel.integrations import wandb_callback
    cb = wandb_callback(project="fedsel", config={"strategy": "fedcor"})
    fedsel.run("fedcor.toml", on_round=cb)
    cb.finish()
"""

from __future__ import annotations

import numbers
import time
from typing import Any, Mapping


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in record.items()
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and k != "round"
    }


def _step(record: Mapping[str, Any]) -> int | None:
    r = record.get("round")
    return None if r is None else int(r)


class WandbCallback:
    """Logs each round to a Weights & Biases run (``wandb.init(**init)``, or ``run``)."""

    def __init__(self, run: Any = None, **init: Any) -> None:
        import wandb  # optional dependency

        self.run = run if run is not None else wandb.init(**init)

    def __call__(self, record: Mapping[str, Any]) -> None:
        # Committed at once: W&B otherwise holds a step until the next one is logged.
        self.run.log(_numbers(record), step=_step(record), commit=True)

    def finish(self) -> None:
        """Finishes the W&B run."""
        self.run.finish()


class MlflowCallback:
    """Logs each round to an MLflow run: ``run_id`` continues one, else a run is started in
    ``experiment`` (created if missing; MLflow's default experiment when ``None``) at
    ``tracking_uri`` (MLflow's default when ``None``: ``MLFLOW_TRACKING_URI``, else ./mlruns).
    ``params`` are logged once as the run's parameters."""

    def __init__(
        self,
        experiment: str | None = None,
        *,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient  # optional dependency

        self.client = MlflowClient(tracking_uri=tracking_uri)
        if run_id is None:
            if experiment is None:
                experiment_id = "0"
            else:
                found = self.client.get_experiment_by_name(experiment)
                experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.run_id = run_id
        for k, v in (params or {}).items():
            self.client.log_param(run_id, k, v)

    def __call__(self, record: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = _step(record) or 0
        metrics = [Metric(k, v, now, step) for k, v in _numbers(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, status: str = "FINISHED") -> None:
        """Marks the MLflow run as ended (``FINISHED``, ``FAILED`` or ``KILLED``)."""
        self.client.set_terminated(self.run_id, status=status)


def wandb_callback(run: Any = None, **init: Any) -> WandbCallback:
    """A callback logging each round to W&B: to ``run``, or to a new ``wandb.init(**init)``
    run (``project=``, ``name=``, ``config=``, ``mode="offline"``, ...)."""
    return WandbCallback(run, **init)


def mlflow_callback(
    experiment: str | None = None,
    *,
    run_name: str | None = None,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> MlflowCallback:
    """A callback logging each round to MLflow (see :class:`MlflowCallback`)."""
    return MlflowCallback(experiment, run_name=run_name, tracking_uri=tracking_uri, run_id=run_id, params=params)
