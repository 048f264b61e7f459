"""deploy/grafana/slotscope.json: its panels' queries, and what each must show when
tests/live/test_watch.py runs them on a real Prometheus. tests/unit/test_dashboard.py holds the
two together, so a panel that Prometheus never ran fails there."""
from __future__ import annotations

import json
import os

DASHBOARD = os.path.join(os.path.dirname(__file__), "..", "deploy", "grafana", "slotscope.json")

# The scrape target each panel's series come from in that run: "watch", the real watch tracing a
# writer on this kernel; "nfs", watch's own Metrics, served by the test and fed the rpc and slots
# rows of a saturated transport (this kernel has no NFS to trace); "none", a query that only has
# to run (no event is lost there).
SOURCES = {
    "Bytes written per second, by mount": "watch",
    "Traced syscalls per second, by syscall": "watch",
    "Syscall latency p99, by syscall": "watch",
    "Syscalls blocked over a second": "watch",
    "Slots in use (mean), by node and server": "nfs",
    "Tasks waiting for a slot (mean), by node and server": "nfs",
    "Share of time the slot table was full, by node and server": "nfs",
    "Share of RPC time spent waiting for a slot, by node and server": "nfs",
    "RPC slot wait p99, by server and procedure": "nfs",
    "RPC round trip p99, by server and procedure": "nfs",
    "Incidents, by trigger": "watch",
    "Events lost per second, by counter": "none",
    "Events read per second": "watch",
    "Agent CPU (cores)": "watch",
    "Agent resident memory": "watch",
    "Flight recorder reach": "watch",
}
# Grafana's variables in the queries; promql() puts values in their place.
VARIABLES = ("$__rate_interval", "$instance")


def dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def panel_queries() -> dict[str, str]:
    """title -> the PromQL of each panel with a query (rows have none)."""
    return {p["title"]: t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])}


def promql(expr: str, window_s: int, instance: str) -> str:
    """The query Grafana sends for `expr`: rates over window_s seconds, of one scrape target."""
    return expr.replace("$__rate_interval", f"{window_s}s").replace("$instance", instance)
