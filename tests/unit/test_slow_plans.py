"""SlowPlans: a query whose planning waits on its sources past the bound is reported once per wait."""

from weir.runtime.watch import SlowPlans

PLANNING = {"isTriggerActive": True, "message": "Getting offsets from KafkaV2[Subscribe[orders]]"}


def test_a_wait_past_the_bound_is_reported_once_naming_what_spark_does():
    plans = SlowPlans(after=60)
    assert plans.check("enrich", PLANNING, 100.0) is None
    assert plans.check("enrich", PLANNING, 159.0) is None
    note = plans.check("enrich", PLANNING, 161.0)
    assert note == f"planning a batch has waited 61 s on its sources (Spark: {PLANNING['message']})"
    assert plans.check("enrich", PLANNING, 300.0) is None  # once per wait


def test_a_batch_that_runs_ends_the_wait_and_a_new_wait_is_counted_afresh():
    plans = SlowPlans(after=60)
    plans.check("enrich", PLANNING, 0.0)
    assert plans.check("enrich", PLANNING, 61.0) is not None
    assert plans.check("enrich", {"isTriggerActive": True, "message": "Processing new data"}, 62.0) == ""  # ended
    assert plans.check("enrich", PLANNING, 63.0) is None
    assert plans.check("enrich", PLANNING, 122.0) is None
    assert plans.check("enrich", PLANNING, 124.0) is not None


def test_an_idle_query_or_another_processor_is_not_a_slow_plan():
    plans = SlowPlans(after=60)
    idle = {"isTriggerActive": False, "message": "Waiting for next trigger"}
    assert plans.check("enrich", idle, 0.0) is None and plans.check("enrich", idle, 1000.0) is None
    plans.check("a", PLANNING, 0.0)
    assert plans.check("b", PLANNING, 61.0) is None  # b's wait began at 61


def test_a_query_is_looked_at_every_few_seconds_at_most():
    plans = SlowPlans(after=60, every=2)
    assert plans.due("enrich", 0.0) and not plans.due("enrich", 1.9) and plans.due("enrich", 2.0)
    assert plans.due("total", 1.0)  # each query its own
