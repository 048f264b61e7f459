"""The named thresholds of the findings: defaults, what each means, and overrides.

Every finding compares measured quantities (shown in its evidence) with these. They
are deliberately few; `slotscope analyze --threshold NAME=VALUE` overrides one, and
`slotscope analyze --thresholds` lists them with their meaning.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


def _t(default: float, doc: str):
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Thresholds:
    # slot_saturation
    saturated_share: float = _t(0.2, "slot_saturation: share of the save window with the slot table full "
                                     "(tasks waiting for a slot) that makes it a warning")
    saturated_share_critical: float = _t(0.5, "slot_saturation: share that makes it critical")
    slot_wait_share: float = _t(0.25, "slot_saturation: slot wait's share of WRITE execute time needed "
                                      "for a warning (and for critical)")
    # server_unresponsive
    silent_server_s: float = _t(5.0, "server_unresponsive: seconds without any reply from a server while "
                                     "RPCs sent to it are outstanding")
    silent_server_critical_s: float = _t(20.0, "server_unresponsive: silence that makes it critical (so "
                                               "do kernel 'not responding' lines and RPC timeouts)")
    # flush_commit_stall
    flush_share: float = _t(0.5, "flush_commit_stall: share of a rank's save spent in close/fsync/"
                                 "fdatasync/sync_file_range")
    flush_min_s: float = _t(1.0, "flush_commit_stall: seconds in those calls a rank needs (median rank)")
    flush_link_util: float = _t(0.5, "flush_commit_stall: the flush is only a stall while the link toward "
                                     "the server carries less than this share of its capacity")
    commit_slow_ms: float = _t(100.0, "flush_commit_stall from mountstats alone (no samples of the ranks): a "
                                      "COMMIT round trip this slow, summed over flush_min_s, is a stall")
    # small_sync_writes
    small_write_bytes: float = _t(65536, "small_sync_writes: a WRITE RPC below this size is small")
    small_sync_share: float = _t(0.5, "small_sync_writes: share of a rank's WRITE RPCs that are small and "
                                      "stable (FILE_SYNC/DATA_SYNC)")
    small_sync_min_rpcs: float = _t(64, "small_sync_writes: fewer small stable WRITEs than this are noise")
    small_sync_rank_share: float = _t(0.25, "small_sync_writes: share of the ranks affected that makes it "
                                            "a warning (fewer: info)")
    # metadata_storm
    metadata_share: float = _t(0.5, "metadata_storm: share of RPC (or syscall) time in metadata operations")
    metadata_min_ops: float = _t(200, "metadata_storm: fewer metadata operations than this are noise")
    # straggler_rank
    straggler_ratio: float = _t(2.0, "straggler_rank: a rank whose save ends this many times later than "
                                     "the median rank's (both since the job's save began)")
    straggler_min_s: float = _t(1.0, "straggler_rank: and at least this many seconds after the median")
    # saves
    save_gap_s: float = _t(10.0, "saves: seconds without file events on the written files that separate "
                                 "two saves in one recording")
    # hung_tasks
    hung_s: float = _t(30.0, "hung_tasks: an RPC outstanding, or a syscall blocked, for this many seconds")

    @classmethod
    def described(cls) -> list[tuple[str, float, str]]:
        return [(f.name, f.default, f.metadata["doc"]) for f in fields(cls)]

    def override(self, items: list[str]) -> "Thresholds":
        """NAME=VALUE strings applied on top; ValueError with a clear message on a bad one."""
        known = {f.name for f in fields(self)}
        changes = {}
        for item in items:
            name, sep, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in known:
                raise ValueError(f"unknown threshold {item!r}; known: {', '.join(sorted(known))}")
            try:
                changes[name] = float(value)
            except ValueError:
                raise ValueError(f"threshold {name} wants a number, not {value!r}") from None
        return replace(self, **changes)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
