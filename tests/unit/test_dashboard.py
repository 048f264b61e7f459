"""The Grafana dashboard (deploy/grafana/slotscope.json): each panel's query is one that
tests/live/test_watch.py runs on a real Prometheus (tests/dashboard.py lists them), and it asks
only for metrics that watch serves."""
import re

import pytest

from dashboard import SOURCES, VARIABLES, dashboard, panel_queries
from slotscope.agent.metrics import Metrics

pytestmark = pytest.mark.unit


def served_names() -> set[str]:
    """Every sample name watch's endpoint can serve (histograms' _bucket, _sum and _count,
    counters' _total), from the collector itself."""
    names = set()
    for family in Metrics(per_process=True).collect():
        suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",)}.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
    return names


def test_every_panel_runs_on_prometheus_in_the_live_test():
    """A new panel fails here until tests/dashboard.py says where its series come from in the
    live run (which then runs it); a panel gone leaves no stale entry."""
    titles = [p["title"] for p in dashboard()["panels"] if p["type"] != "row"]
    assert len(titles) == len(set(titles))
    assert sorted(titles) == sorted(panel_queries()) == sorted(SOURCES)


def test_the_panels_ask_for_what_watch_serves():
    served = served_names()
    for title, expr in panel_queries().items():
        used = set(re.findall(r"\bslotscope_\w+", expr))
        assert used and used <= served, (title, used - served)


def test_the_panels_use_the_dashboards_variables_and_one_query_each():
    d = dashboard()
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "instance"}
    for panel in d["panels"]:
        if panel["type"] == "row":
            continue
        [target] = panel["targets"]
        assert panel["datasource"] == target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert set(re.findall(r"\$\w+", target["expr"])) <= set(VARIABLES), panel["title"]
