"""What the `loss` table's counters count, declared once: the BPF programs count into them in
this order (agent/layouts.py numbers them), the agent stores their deltas with the probe group
named here, and the analysis says what a loss can have made incomplete."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossCounter:
    probe: str              # the probe group that counts it (the `probe` column)
    lost: str               # what one count is
    # what such a loss can leave incomplete: "ranks" (per-rank figures, or which rank a
    # process is), "files" (which file a call or a WRITE was on), "rpcs", "slots" (occupancy)
    affects: tuple[str, ...]
    # the state it can lose that later rows need: "fd" (which file an fd is: the agent drops the
    # calls on an fd it cannot name, meta.json's totals.unnamed_fd_rows) or "identity" (which
    # rank a process is); None when only rows of its own time are lost
    lasting: str | None = None


# The programs' counters; the order is their index in the BPF array.
BPF_COUNTERS = {
    "sys_ring_full": LossCounter("syscalls", "syscall rows", ("ranks", "files"), lasting="fd"),
    "path_ring_full": LossCounter("syscalls", "file paths of syscalls", ("files",), lasting="fd"),
    "proc_ring_full": LossCounter("syscalls", "process start, exec and exit events", ("ranks",),
                                  lasting="identity"),
    "inflight_full": LossCounter("syscalls", "syscalls not followed (in-flight table full)", ("ranks", "files"),
                                 lasting="fd"),
    "path_read_failed": LossCounter("syscalls", "file paths the kernel could not read", ("files",), lasting="fd"),
    "rpc_ring_full": LossCounter("sunrpc", "RPC rows (with the slot-table samples of their slots)", ("rpcs", "slots")),
    "rpc_tasks_full": LossCounter("sunrpc", "RPCs not followed (task table full)", ("rpcs",)),
    "nfs_ring_full": LossCounter("nfs", "NFS WRITE/COMMIT rows", ("files", "ranks")),
    "rpc_slot_ring_full": LossCounter("sunrpc", "slot-table samples", ("slots",)),
    "owner_ring_full": LossCounter("nfs_owner", "RPC owner records", ("ranks",)),
    "xprt_ring_full": LossCounter("xprt", "transport counter samples", ("slots",)),
    "env_ring_full": LossCounter("syscalls", "rank variables read at exec", ("ranks",), lasting="identity"),
}
# Counted by the agent itself: rows it did not write once the capture reached --max-size.
MAX_SIZE_ROWS = "max_size_rows"
# Counted by the sampled mode (record --no-bpf): samples it could not take on time.
SAMPLED_COUNTERS = {
    "samples_late": LossCounter("sampled", "intervals not sampled (the sample before was still reading /proc)",
                                ("ranks", "slots")),
    "reads_timed_out": LossCounter("sampled", "threads whose /proc files did not answer within the timeout",
                                   ("ranks",)),
}
LOSS_COUNTERS = {**BPF_COUNTERS, **SAMPLED_COUNTERS,
                 MAX_SIZE_ROWS: LossCounter("capture", "rows past --max-size", ("ranks", "files", "rpcs", "slots"))}
