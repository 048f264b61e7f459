"""One or many captures (one per node) as one job: tables stacked with their host."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .capture import Capture, open_captures

WRITE_SYSCALLS = ("write", "pwrite64", "writev", "pwritev", "pwritev2")


@dataclass
class Job:
    captures: list[Capture]

    @classmethod
    def open(cls, paths: list[str]) -> "Job":
        return cls(open_captures(paths))

    def table(self, name: str) -> pa.Table | None:
        """The table from every capture, with a `host` column, or None when no capture has rows."""
        parts = []
        for cap in self.captures:
            t = cap.read(name)
            if t is not None:
                host = cap.meta.get("host", "?")
                parts.append(t.append_column("host", pa.array([host] * t.num_rows, pa.string())))
        if not parts:
            return None
        return pa.concat_tables(parts, promote_options="permissive")

    def identities(self) -> pa.Table | None:
        """The best identity of each (host, tgid): complete before incomplete, then the last
        (exec can change a process's command line)."""
        procs = self.table("procs")
        if procs is None:
            return None
        # A complete identity beats an incomplete one (a /proc read that timed out), then later wins.
        procs = procs.sort_by([("host", "ascending"), ("tgid", "ascending"), ("complete", "ascending"),
                               ("ts", "ascending")])
        host, tgid = procs["host"], procs["tgid"]
        n = procs.num_rows
        if n == 0:
            return procs
        # the last row of each (host, tgid) run
        same_next = pc.and_(pc.equal(host.slice(0, n - 1), host.slice(1)),
                            pc.equal(tgid.slice(0, n - 1), tgid.slice(1)))
        last = pa.concat_arrays([pc.invert(same_next).combine_chunks(), pa.array([True])])
        return procs.filter(last)

    def problems(self) -> list[str]:
        return [f"{c.path}: {p}" for c in self.captures for p in c.problems]

    def lost_events(self, cap: Capture) -> int:
        t = cap.read("loss")
        return int(pc.sum(t["lost"]).as_py() or 0) if t is not None else 0
