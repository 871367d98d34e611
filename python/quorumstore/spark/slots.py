"""Fail-fast check that the application has a free task slot for every storage node.

Each node holds a task slot for the cluster's whole life. With too few slots a barrier
job does not fail: Spark re-checks every 15 s for about 10 minutes, and a plain job just
queues, so the user would wait for nothing. Checking first turns that into an error
that says what is missing and which setting changes it.

Slots are counted the way Spark's barrier check counts them (registered executors'
cores divided by ``spark.task.cpus``) minus the tasks running now. When the
configuration says the slots can never suffice (``local[N]``, ``local-cluster[E,C,M]``,
or a static ``spark.executor.instances`` x ``spark.executor.cores``) the check fails at
once; otherwise it waits, up to the start timeout, for executors still registering.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from pyspark import SparkContext

log = logging.getLogger(__name__)

_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")


class NotEnoughSlotsError(RuntimeError):
    """The application cannot give every storage node a task slot of its own."""


@dataclass(frozen=True)
class Slots:
    total: int
    busy: int

    @property
    def free(self) -> int:
        return self.total - self.busy


def check_free_slots(sc: SparkContext, needed: int, timeout_s: float) -> None:
    """Returns once `needed` slots are free; raises NotEnoughSlotsError when they cannot be."""
    configured = configured_slots(sc)
    if configured is not None and configured < needed:
        raise NotEnoughSlotsError(_message(sc, needed, Slots(configured, 0), "configured"))
    master = _master(sc)
    waits = not master.startswith("local[") and master != "local"
    deadline = time.monotonic() + (timeout_s if waits else 0.0)
    while True:
        slots = current_slots(sc)
        if slots.free >= needed:
            if slots.free == needed and configured is not None and configured == slots.total:
                log.warning(
                    "the %d storage nodes take every free Spark task slot (%d of %d): this "
                    "application's other Spark jobs, DataFrame reads of quorumstore included, "
                    "will wait until the cluster stops; give Spark at least one slot more",
                    needed,
                    slots.free,
                    slots.total,
                )
            return
        if time.monotonic() >= deadline:
            raise NotEnoughSlotsError(_message(sc, needed, slots, "free"))
        time.sleep(0.5)


def _master(sc: SparkContext) -> str:
    # Set on every running context; pyspark types the attribute as optional.
    if sc.master is None:
        raise RuntimeError("the SparkContext has no master URL; is it stopped?")
    return sc.master


def configured_slots(sc: SparkContext) -> int | None:
    """Slots the master and executor settings promise, or None where they do not say."""
    conf = sc.getConf()
    task_cpus = int(conf.get("spark.task.cpus", "1"))
    master = _master(sc)
    match = _LOCAL_CLUSTER.fullmatch(master)
    if match:
        return int(match[1]) * int(match[2]) // task_cpus
    if master.startswith("local"):
        return current_slots(sc).total
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    dynamic = conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true"
    if instances and cores and not dynamic:
        return int(instances) * int(cores) // task_cpus
    return None


def current_slots(sc: SparkContext) -> Slots:
    """Slots of the executors registered now (Spark's own barrier count) and tasks running."""
    jsc = sc._jsc.sc()
    total = jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile())
    tracker = sc.statusTracker()
    busy = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            busy += info.numActiveTasks
    return Slots(total, busy)


def _message(sc: SparkContext, needed: int, slots: Slots, kind: str) -> str:
    have = (
        f"the configuration allows {slots.total}"
        if kind == "configured"
        else f"{slots.free} of {slots.total} are free ({slots.busy} running other tasks)"
    )
    return (
        f"quorumstore needs {needed} free Spark task slots, one per storage node for the cluster's "
        f"whole life, but {have} (master {sc.master}). Start fewer nodes, or give the application "
        f"more slots: a local master with more threads (e.g. local[{needed + 1}]), more "
        "spark.executor.instances or spark.executor.cores, or a lower spark.task.cpus; "
        "or wait for other jobs to finish."
    )
