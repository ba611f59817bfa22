"""`Victims.rank` is `eligible` then `order_key`, in one call, for every built-in plugin."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.cycle import schedule
from corral.core.model import JobId, JobSpec, QueueName
from corral.core.plugins import Victims
from corral.core.same_queue import SameQueue
from corral.policies.registry import load_policy
from corral.policies.victims import AttainedService, AttainedServiceArgs, PriorityReclaim, PriorityReclaimArgs
from tests.core.test_properties import PRIORITIES, _fields, clusters, jobs

PLUGINS: list[Victims] = [
    PriorityReclaim(),
    PriorityReclaim(PriorityReclaimArgs(reclaim=False)),
    AttainedService(),
    AttainedService(AttainedServiceArgs(thresholds=(100.0, 1000.0, 5000.0))),
    SameQueue(PriorityReclaim()),
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rank_is_eligible_then_order_key(data: st.DataObject) -> None:
    state = data.draw(clusters())
    profile = data.draw(st.sampled_from(["default", "las"]))
    now = 0.0
    for round_ in range(3):
        for spec in data.draw(jobs(len(state.queues), round_ * 10)):
            state.submit(JobSpec(**{**_fields(spec), "submit_time": now}))
        schedule(state, load_policy(profile), now)
        now += data.draw(st.sampled_from([1.0, 400.0, 700.0, 4000.0]))
    prio, name = data.draw(st.sampled_from(PRIORITIES))
    preemptor = state.submit(
        JobSpec(
            JobId("p"),
            QueueName(f"q{data.draw(st.integers(0, len(state.queues) - 1))}"),
            gpus_per_replica=data.draw(st.sampled_from([1, 2, 8])),
            priority=prio,
            priority_class=name,
        ),
        attained=data.draw(st.sampled_from([0.0, 500.0, 4000.0, 50000.0])),
    )
    attempts = list(state.running.values())
    for plugin in PLUGINS:
        expected = sorted(
            (a for a in attempts if plugin.eligible(preemptor, a, state, now)),
            key=lambda a, p=plugin: p.order_key(a, state, now),
        )
        assert plugin.rank(preemptor, attempts, state, now) == expected, plugin
