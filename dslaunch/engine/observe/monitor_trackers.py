"""The hosted experiment trackers among the monitors: Weights & Biases (``wandb``) and Comet
(``comet``), with DeepSpeed's config keys and the events ``monitor.py``'s other monitors get.

Neither package is a dependency (``pip install dslaunch[monitors]`` brings both): each is
imported when its section is enabled, and a missing one is a clear error naming the key. Both
run offline as their libraries allow: ``WANDB_MODE=offline`` (the run is written under
``WANDB_DIR``), ``comet.online: false`` (an offline experiment archived under
``COMET_OFFLINE_DIRECTORY`` when it ends, at ``engine.destroy()`` or process exit).
"""

from __future__ import annotations


def _missing(package: str, key: str) -> RuntimeError:
    return RuntimeError(
        f"{key}.enabled: the {package} package is not installed; `pip install {package}` "
        f"(or `pip install dslaunch[monitors]`) or disable the {key} section")


class WandbMonitor:
    """One W&B run on rank 0: ``wandb.init(project, group, entity=team)``; each event is logged
    with its global-samples count as the step."""

    def __init__(self, section):
        try:
            import wandb
        except ImportError as e:
            raise _missing("wandb", "wandb") from e
        self.wandb = wandb
        self.run = wandb.init(project=section.project, group=section.group,
                                   entity=section.team)

    def write_events(self, events) -> None:
        for name, value, step in events:
            self.run.log({name: value}, step=step)

    def close(self) -> None:
        self.run.finish()
        # finish() can return before W&B's service has written the run file (an offline run
        # read right after was sometimes still empty); tearing the service down flushes it, as
        # process exit would. Only when no other run of the script is open.
        if self.wandb.run is None:
            self.wandb.teardown()


class CometMonitor:
    """One Comet experiment on rank 0 (``comet_ml.start`` with the section's project, workspace,
    key, mode and ``online``). An event is logged when it is new or at least
    ``samples_log_interval`` samples have passed since it was last logged (DeepSpeed's rule, so
    a fast loop does not flood the service)."""

    def __init__(self, section):
        try:
            import comet_ml
        except ImportError as e:
            raise _missing("comet_ml", "comet") from e
        self.interval = section.samples_log_interval
        self.experiment = comet_ml.start(
            api_key=section.api_key, project=section.project, workspace=section.workspace,
            experiment_key=section.experiment_key, mode=section.mode, online=section.online)
        if section.experiment_name is not None:
            self.experiment.set_name(section.experiment_name)
        self._last: dict = {}  # event name -> samples when last logged

    def write_events(self, events) -> None:
        for name, value, step in events:
            last = self._last.get(name)
            if last is None or step - last >= self.interval:
                self._last[name] = step
                self.experiment.log_metric(name, value, step=step)

    def close(self) -> None:
        self.experiment.end()
