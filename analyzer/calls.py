"""The one pass over a capture's syscall table (the biggest there is): calls summed per
process, syscall and file. Everything that needs less detail regroups this small table."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .job import Job, with_host

AGGREGATES = [("latency_ns", "count"), ("latency_ns", "sum"), ("latency_ns", "max"), ("bytes", "sum"),
              ("ts_enter", "min"), ("ts_exit", "max")]


def file_calls(job: Job) -> pa.Table | None:
    """Syscall rows summed per (host, tgid, syscall, dev, ino): count, total and max latency,
    bytes, first entry, last exit. The one pass over the syscall table (the biggest there is):
    grouped per capture on its raw columns; what needs less detail regroups this."""
    def compute():
        parts = []
        for cap, sc in job.per_capture("syscall"):
            g = sc.group_by(["tgid", "syscall", "dev", "ino"]).aggregate(AGGREGATES)
            g = g.set_column(g.schema.get_field_index("syscall"), "syscall", pc.cast(g["syscall"], pa.string()))
            parts.append(with_host(g, cap.meta.get("host", "?")))
        return pa.concat_tables(parts) if parts else None
    return job.memo("file_calls", compute)
