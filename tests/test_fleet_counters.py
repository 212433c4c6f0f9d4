"""The fleet's /metrics counters never go down when a replica is down or restarts (prometheus.Counts)."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from engine.entrypoints.router import prometheus


def page(requests: float, latency_count: float) -> dict:
    return prometheus.parse(
        "# TYPE vllm:request_success_total counter\n"
        f'vllm:request_success_total{{model_name="m"}} {requests}\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        f'vllm:e2e_request_latency_seconds_count{{model_name="m"}} {latency_count}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="m"}} {requests % 3}\n')


def total(families: list, name: str) -> float:
    return sum(value for family in families for sample, _, value in family.samples if sample == name)


def test_a_replica_down_counts_what_it_last_said_and_a_restarted_one_what_it_had_before():
    counts = prometheus.Counts()
    scrapes = [[page(10, 4), page(5, 2)],
               [page(11, 4), None],            # replica 1 down: its 5 are still counted, its gauge is gone
               [page(12, 5), page(2, 1)],      # replica 1 restarted from zero: 5 + 2
               [page(12, 5), page(3, 1)]]
    seen = []
    for pages in scrapes:
        families = prometheus.aggregate(pages, counts)
        seen.append((total(families, "vllm:request_success_total"),
                     total(families, "vllm:e2e_request_latency_seconds_count")))
    assert seen == [(15, 6), (16, 6), (19, 8), (20, 8)]
    running = next(f for f in prometheus.aggregate([page(12, 5), None], counts)
                   if f.name == "vllm:num_requests_running")
    assert [dict(labels)["replica"] for _, labels, _ in running.samples] == ["0"]


# Each replica's true count grows by a step per scrape; a replica may be down (no page) or restart (its page
# counts from zero again).
events = st.lists(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["up", "down", "restart"])),
                           min_size=2, max_size=2), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(events)
def test_the_fleet_sum_never_goes_down_and_counts_what_prometheus_would_increase(scrapes):
    counts = prometheus.Counts()
    shown = [0.0, 0.0]           # what each replica's own page says (from zero again after a restart)
    increase = 0.0               # Prometheus's increase() over each replica's pages, summed
    previous = 0.0
    for scrape in scrapes:
        pages = []
        for replica, (grown, event) in enumerate(scrape):
            if event == "down":
                pages.append(None)
                continue
            before = shown[replica]
            shown[replica] = (0.0 if event == "restart" else before) + grown
            # a fall is a reset: the new life's count is all new (a restart that reads no lower looks like growth)
            increase += shown[replica] if shown[replica] < before else shown[replica] - before
            pages.append(page(shown[replica], shown[replica]))
        now = total(prometheus.aggregate(pages, counts), "vllm:request_success_total")
        assert now >= previous
        previous = now
    assert previous == increase
