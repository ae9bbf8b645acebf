"""Thin Tune trials: Ray Tune stays the sweep engine, a Tune trial per trial of the sweep (names, results, callbacks),
each a thin one that holds no core and forwards to Tune the epochs its trial's slot trains (cluster/slots.py), as the
Dispatcher collected them.
"""

from __future__ import annotations

from collections.abc import Callable

from .dispatcher import broker_name, dispatcher_name, tune_run_trial
from .placement import thin_trial_bundles

NEWS_WAIT_S = 30.0  # the longest a thin trial's question for news waits before it asks again
STARTED = "slot_started_after_epoch"  # the result a thin trial reports when its slot takes the trial
NOTE = "trial_note"  # the result a thin trial reports for a line its trial's log must say (Dispatcher.note)


class TrialFailed(RuntimeError):
    """A trial's attempts are used up; its trial.json has the status and the one-line error."""


def thin_trial(tune_config: dict) -> None:
    """A trial as Tune runs it: it forwards the epochs its slot trains to Tune."""
    import ray
    from ray import tune
    from ray.tune.result import TIMESTEPS_TOTAL

    spec = tune_run_trial(tune_config)
    dispatcher = find_dispatcher(spec.run_dir.name)
    # Every epoch from the first: a short trial can end in its slot before Tune starts this, and is still reported.
    seen = 0
    while True:
        news = ray.get(dispatcher.read.remote(spec.name, seen, NEWS_WAIT_S))
        seen += len(news)
        for event in news:
            if "start" in event:  # its slot took it: the progress callback prints "starts" now, not at Tune's start
                tune.report({STARTED: event["start"]})
            elif "epoch" in event:
                # Tune's TensorBoard files step a result at its timesteps_total, else at Tune's count of reports
                # (the start counts too): the epoch.
                tune.report(event["epoch"] | {TIMESTEPS_TOTAL: event["epoch"]["epoch"]})
            elif "note" in event:
                tune.report({NOTE: event["note"]})
            elif "failed" in event:
                raise TrialFailed(event["failed"])
            else:
                return


def find_dispatcher(run_name: str):
    """The Dispatcher of the run: its named actor, else the one a warm pool of this job started for it
    (cluster/pool.py: a pool starts each sweep's Dispatcher before the sweep, so it cannot be named after it)."""
    import ray

    try:
        return ray.get_actor(dispatcher_name(run_name))
    except ValueError:
        return ray.get(ray.get_actor(broker_name()).dispatcher_of.remote(run_name))


def thin_trainable() -> Callable[[dict], None]:
    """thin_trial with no core of its own, as Tune takes it. tune.with_resources sets an attribute on the
    function; through Ray Client (ray://) Tune runs in a remote actor that gets the trainable pickled, and a
    module-level function travels by reference, without the attribute (every trial then held Tune's default
    1 CPU). A local function travels by value, attribute included."""
    from ray import tune

    def cifar_ray_thin_trial(config: dict) -> None:
        thin_trial(config)

    return tune.with_resources(cifar_ray_thin_trial, tune.PlacementGroupFactory(thin_trial_bundles()))
