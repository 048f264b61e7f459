"""Probe groups. Each says whether it can run on this kernel (and why not), and loads.

Like retis's collectors: can_run() returns None or the precise reason, so
`doctor` and `record` say the same thing; an optional group that cannot run is
skipped quietly and recorded in meta.json, a requested one fails loudly.

The groups that can run are compiled as one BPF program (one compile: it takes
~30 s under emulation): the generated header, bpf/common.h, then each group's C.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import select
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Callable

import numpy as np

from slotscope.capture.syscalls import OPS

from . import aggregates, btf, kernel
from .identity import RANK_VARS
from .layouts import (ENV_EVENT, INFLIGHT, LOSS_COUNTERS, NFS_EVENT, OWNER_EVENT, PATH_EVENT, PATH_MAX_CAPTURED,
                      PROC_EVENT, RINGS, RPC_EVENT, SLOT_EVENT, SYS_EVENT, XPRT_EVENT, Layout, c_header)
from .memory import release_compiler
from .priority import DrainPriority, filling, unpreempted
from .ringbuf import RingReader, record_size
from .rpc_rows import RPC_SLOT_FIELDS, nfs_table, owners_table, rpc_table, slots_table, xprt_table

PAGE = os.sysconf("SC_PAGE_SIZE")
BPF_ANY, BPF_NOEXIST = 0, 1
BPF_STATS_RUN_TIME = 0     # enum bpf_stats_type
KPROBE = "kprobe:"    # an attach point that is a kprobe, before its function (a tracepoint's is its category)
# When to drain. Each drain has a fixed cost, ~0.3 ms idle and ~2 ms with every NFS
# table to build (30x that under emulation), that at 50 drains a second was most of the
# agent's CPU; so the rings are drained every DRAIN_EVERY s, sooner when the kernel asks
# (a ring an eighth full, an exec: wake_flags in bpf/common.h) or a signal arrives (see
# wake_on), but at most every DRAIN_MIN s, and at once while a ring is BUSY_FILL full.
DRAIN_EVERY = 1.0
DRAIN_MIN = 0.02
BUSY_FILL = 0.05


def common_reason() -> str | None:
    """What every BPF probe group needs."""
    missing = kernel.bpf_privilege_missing()
    if missing:
        return missing
    if kernel.bpf_ringbuf_supported() is False:
        return (f"this kernel ({os.uname().release}) has no BPF ring buffers (BPF_MAP_TYPE_RINGBUF: Linux 5.8 "
                f"or later, or a distribution backport), through which every probe hands over its events")
    if kernel.ensure_tracefs() is None:
        return "tracefs is not mounted and could not be mounted at /sys/kernel/tracing"
    err = kernel.bcc_import_error()
    if err:
        return f"cannot import bcc ({err}): install python3-bpfcc (Debian/Ubuntu) or python3-bcc (Fedora)"
    if kernel.headers_dir() is None:
        return (f"no kernel headers at /lib/modules/{os.uname().release}/build: "
                f"install linux-headers-{os.uname().release} (./dev.sh setup links a fallback)")
    return None


def _kallsyms(names: set[str], module: str) -> dict[str, int]:
    """Addresses of functions of `module`, or of the kernel where it is built in (root sees real
    ones; zeros mean hidden). Another module's function of the same name is not taken."""
    found = {}
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                parts = line.split()
                if (len(parts) >= 3 and parts[2] in names and parts[2] not in found
                        and parts[3:] in ([], [f"[{module}]"])):
                    addr = int(parts[0], 16)
                    if addr:
                        found[parts[2]] = addr
    except OSError:
        pass
    return found


# Types some kernels give a tracepoint field that BCC's struct for its arguments names without
# defining: the kernel header that defines each, included before the group's program
# (5.10's nfs:* `stable` is an enum nfs3_stable_how; later kernels' an unsigned long).
FIELD_TYPE_HEADERS = {"enum nfs3_stable_how": "linux/nfs.h"}


def _missing_tracepoints(required: list[tuple[str, str]]) -> str | None:
    missing = [f"{c}:{e}" for c, e in required if not kernel.tracepoint_exists(c, e)]
    return f"no {', '.join(missing)} tracepoint" + ("s" if len(missing) > 1 else "") if missing else None


def wake_every(layout: Layout, pages: int) -> int:
    """Events per CPU between the wakeups the kernel forces (bpf/common.h): an eighth of
    the ring over all CPUs."""
    return max(1, pages * PAGE // record_size(layout) // (8 * (os.cpu_count() or 1)))


# watch's rings are record's over 2**WATCH_RING_SHIFT: a ring's pages are all resident (the
# kernel maps it whole), 37.5 MiB of record's with the NFS groups. The kernel still forces a
# wakeup after as many events as in record (an eighth of record's ring, half of watch's), so
# that at a save's pace watch drains no more often than record (each drain builds every
# table: forced wakeups were once the agent's largest cost in the VM bench); in a storm half
# a ring is left for the drain's latency, and the drain keeps at it while a ring is BUSY_FILL full.
WATCH_RING_SHIFT = 2


def ring_sizes(group: "ProbeGroup", watch: bool) -> dict[str, tuple[Layout, int, int]]:
    """A group's rings as loaded: ring -> (layout, pages, wake_every)."""
    shift = WATCH_RING_SHIFT if watch else 0
    return {ring: (layout, pages >> shift, wake_every(layout, pages)) for ring, (layout, pages) in group.rings.items()}


@dataclass
class Filters:
    """What the kernel side filters on (the rest is decided in user space)."""
    tgids: list[int] = field(default_factory=list)   # trace these and their descendants only
    cgroup: str | None = None                        # cgroup v2 directory
    devs: frozenset[int] | None = None               # stats of other devices are dropped (files.traced_devs)
    prefixes: tuple[str, ...] = ()                   # --path: calls plainly outside them are dropped
    aggregate: bool = False                          # watch's in-kernel aggregates (aggregates.py), rings (ring_sizes)


PATH_PREFIXES_MAX = 4   # the kernel drops calls outside at most this many --path prefixes; beyond, user space


def path_filter_flags(prefixes: tuple[str, ...]) -> list[str]:
    """The -D flags of bpf/syscalls.c's --path filter: PATH_RELATED(s), true for a path s (its
    bytes; normal, absolute) at or under a prefix, or above one (a directory the prefix is
    in), compared byte by byte. None where user space must decide alone: no prefix, "/",
    more than PATH_PREFIXES_MAX, or one too long for the kernel's path buffer."""
    encoded = [p.encode() for p in prefixes]
    if not encoded or len(encoded) > PATH_PREFIXES_MAX or b"/" in encoded or \
            any(len(p) >= PATH_MAX_CAPTURED - 1 for p in encoded):
        return []

    def starts(p: bytes, n: int) -> list[str]:
        return [f"s[{j}]=={p[j]}" for j in range(n)]
    terms = []
    for p in encoded:
        terms.append(starts(p, len(p)) + [f"(s[{len(p)}]==0||s[{len(p)}]=={ord('/')})"])   # at or under
        terms += [starts(p, m) + [f"s[{m}]==0"] for m in range(1, len(p)) if p[m] == ord("/")]   # above
    return ["-DFILTER_PATHS", f"-DPATH_RELATED(s)=({'||'.join('(' + '&&'.join(t) + ')' for t in terms)})"]


@dataclass(frozen=True)
class Stream:
    """What a probe group's rings become in the capture: `build(drain, *records)` makes the rows
    of `table` from one drain's records of `rings` (None: nothing to write). `drain` gives the
    decoding state (drain.decoder, drain.clients, drain.now_ns). A stream is built when one of
    its rings has records, or on every drain with `each_drain`. A `stateless` stream's rows
    depend on its records alone (and on the RPC clients' names): they can be built later, from
    the records kept (watch's flight recorder does, on a trigger; of a ring in `fields`, it
    keeps only the fields the build reads)."""
    table: str
    rings: tuple[str, ...]
    build: Callable
    each_drain: bool = False
    stateless: bool = False
    fields: dict[str, tuple[str, ...]] = field(default_factory=dict)


class ProbeGroup:
    name = ""
    description = ""
    source = ""                              # bpf/<source>
    rings: dict[str, tuple[Layout, int]] = {}  # ring -> (layout, pages, a power of two): record's (ring_sizes)
    streams: tuple[Stream, ...] = ()
    needs = ""                               # the group this one loads with, if any
    required: list[tuple[str, str]] = []
    optional_tracepoints: tuple[tuple[str, str], ...] = ()
    # (category, event, names): a field the program reads as args->EVENT_NAME (upper case, the
    # first name), which some kernels call by one of the other names. Found at run time in the
    # format file, as BCC's tools look before they attach.
    field_variants: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    # What a recording loses without one of the group's attach points (by event or function
    # name), where that is less than the group's whole view (its description).
    gives: dict[str, str] = {}

    def can_run(self) -> str | None:
        raise NotImplementedError

    def attach_points(self, together: set[str]) -> dict[str, str]:
        """The plan `doctor --load` checks against what attached: the points the group's program
        attaches to on this kernel, loaded with the groups named `together` (tracepoints as
        category:event, kprobes as kprobe:function) -> what a recording loses without each."""
        return {f"{cat}:{ev}": self.gives.get(ev, self.description) for cat, ev in self.tracepoints()}

    def tracepoints(self) -> list[tuple[str, str]]:
        return [*self.required, *(tp for tp in self.optional_tracepoints if kernel.tracepoint_exists(*tp))]

    def _fields_found(self) -> list[tuple[str, str, tuple[str, ...], str | None]]:
        """Each field variant of a tracepoint this kernel has: (category, event, names, the name
        found or None)."""
        tracepoints = set(self.tracepoints())
        return [(cat, ev, names, next((n for n in names if n in kernel.tracepoint_fields(cat, ev)), None))
                for cat, ev, names in self.field_variants if (cat, ev) in tracepoints]

    def missing_fields(self) -> str | None:
        missing = [f"{cat}:{ev} has no field {' or '.join(names)}"
                   for cat, ev, names, found in self._fields_found() if found is None]
        return "; ".join(missing) or None

    def fallbacks(self) -> list[str]:
        """What this kernel gives in place of what the group reads first, and what it lacks of
        the group's optional tracepoints (said once, in meta.json and by doctor)."""
        return ([f"{cat}:{ev}: field `{found}` read for `{names[0]}`"
                 for cat, ev, names, found in self._fields_found() if found not in (None, names[0])]
                + [f"no {cat}:{ev} in this kernel: without {self.gives[ev]}"
                   for cat, ev in self.optional_tracepoints if not kernel.tracepoint_exists(cat, ev)])

    def cflags(self, filters: Filters) -> list[str]:
        flags = [f"-D{ring.upper()}_{name}={value}"
                 for ring, (_, pages, wake) in ring_sizes(self, filters is not None and filters.aggregate).items()
                 for name, value in (("PAGES", pages), ("WAKE", wake))]
        flags += [f"-DHAVE_{ev}" for cat, ev in self.optional_tracepoints if kernel.tracepoint_exists(cat, ev)]
        flags += [f"-D{ev.upper()}_{names[0].upper()}={found}" for _, ev, names, found in self._fields_found()
                  if found]
        return flags

    def program_text(self) -> str:
        types = {t for tp in self.tracepoints() for t in kernel.tracepoint_fields(*tp).values()}
        includes = "".join(f"#include <{h}>\n" for t, h in FIELD_TYPE_HEADERS.items() if t in types)
        return includes + resources.files("slotscope.bpf").joinpath(self.source).read_text()


# The rings whose records a syscall record refers to: its paths, the forks and execs before it.
SYS_REFERS_TO = ("path_ring", "proc_ring", "env_ring")


class SyscallProbes(ProbeGroup):
    name = "syscalls"
    description = "file syscalls of every process (syscalls:sys_enter_*/sys_exit_* tracepoints)"
    source = "syscalls.c"
    # The syscall ring absorbs ~50 ms of a 5 M events/s storm between two drains.
    rings = {"sys_ring": (SYS_EVENT, 4096), "path_ring": (PATH_EVENT, 1024), "proc_ring": (PROC_EVENT, 256),
             "env_ring": (ENV_EVENT, 64)}
    # Fed every drain: process exits are applied one drain late (their last calls may follow).
    streams = (Stream("syscall", ("sys_ring", *SYS_REFERS_TO),
                      lambda d, sys, paths, procs, envs: d.decoder.feed(
                          sys, paths, procs, envs, caught_up=d.loaded.syscalls_caught_up), each_drain=True),)
    # The process lifecycle and the environments of execs; each traced syscall's own pair of
    # tracepoints is added where this kernel has both (available_syscalls).
    required = [("task", "task_newtask"), ("sched", "sched_process_exec"), ("sched", "sched_process_exit"),
                ("syscalls", "sys_enter_execve"), ("syscalls", "sys_enter_execveat")]
    gives = {"task_newtask": "forks: whose child a process is (the rank it inherits; --pid's descendants)",
             "sched_process_exec": "execs: a program's command line and rank, read as it starts",
             "sched_process_exit": "exits: when a process ends (then its open files and rank are forgotten)",
             "sys_enter_execve": "the rank variables of programs started with execve()",
             "sys_enter_execveat": "the rank variables of programs started with execveat()"}

    def available_syscalls(self) -> list[str]:
        return [op for op in OPS
                if kernel.tracepoint_exists("syscalls", f"sys_enter_{op}")
                and kernel.tracepoint_exists("syscalls", f"sys_exit_{op}")]

    def can_run(self) -> str | None:
        reason = common_reason()
        if reason:
            return reason
        if not kernel.tracepoint_exists("syscalls", "sys_enter_write"):
            return "no syscalls:sys_enter_write tracepoint (kernel built without CONFIG_FTRACE_SYSCALLS)"
        return _missing_tracepoints(self.required)

    def attach_points(self, together: set[str]) -> dict[str, str]:
        return super().attach_points(together) | {f"syscalls:sys_{side}_{op}": f"{op}() calls"
                                                  for op in self.available_syscalls() for side in ("enter", "exit")}

    def cflags(self, filters: Filters) -> list[str]:
        flags = super().cflags(filters) + [f"-DAGENT_TGID={os.getpid()}", "-DSYSCALLS_GROUP"]
        flags += [f"-DHAVE_{op}" for op in self.available_syscalls()]
        if filters.tgids:
            flags.append("-DFILTER_TGIDS")
        if filters.cgroup:
            flags.append("-DFILTER_CGROUP")
        if filters.devs is not None:
            flags.append("-DFILTER_DEVS")
        flags += path_filter_flags(filters.prefixes)
        return flags


def module_reason(module: str, category: str) -> str | None:
    """Why the `category` tracepoints of a kernel module are not there, or None if they are."""
    base = kernel.tracefs()
    if base and os.path.isdir(os.path.join(base, "events", category)):
        return None
    if kernel.kernel_module_loaded(module):
        return f"the {module} module is loaded but has no {category}:* tracepoints"
    if not os.path.exists("/proc/modules"):
        return (f"this kernel has no {module} (not built in) and cannot load modules (CONFIG_MODULES off): "
                f"NFS tracing needs a kernel with NFS, e.g. the VM rig in tests/vm")
    return (f"the {module} module is not loaded: nothing is mounted over NFS yet "
            f"(mount an NFS export, or `modprobe {module}`)")


class SunrpcProbes(ProbeGroup):
    name = "sunrpc"
    description = "per-RPC spans: slot wait, transmit, round trip, execute (sunrpc:* tracepoints)"
    source = "sunrpc.c"
    # Big enough that the wakeup an eighth of a ring forces (bpf/common.h) comes after
    # seconds of a busy transport's events, not within the drain period: each forced
    # wakeup is one more drain, as costly as the regular one.
    rings = {"rpc_ring": (RPC_EVENT, 1024), "slot_ring": (SLOT_EVENT, 1024)}
    streams = (Stream("rpc", ("rpc_ring",), lambda d, ev: rpc_table(ev, d.clients, d.now_ns()), stateless=True),
               Stream("slots", ("slot_ring", "rpc_ring"), lambda d, ev, rpcs: slots_table(ev, rpcs, d.clients),
                      stateless=True, fields={"rpc_ring": RPC_SLOT_FIELDS}))
    required = [("sunrpc", ev) for ev in ("rpc_task_begin", "rpc_request", "rpc_task_sleep", "rpc_task_wakeup",
                                          "xprt_reserve", "xprt_transmit", "rpc_stats_latency",
                                          "rpc_task_run_action", "rpc_task_end")]
    optional_tracepoints = (("sunrpc", "xprt_retransmit"), ("sunrpc", "rpc_timeout_status"))
    gives = {"xprt_retransmit": "each RPC's retransmissions", "rpc_timeout_status": "each RPC's timeouts",
             "rpc_task_run_action": "when each RPC began to wait for a slot and to transmit"}

    def can_run(self) -> str | None:
        return (common_reason() or module_reason("sunrpc", "sunrpc") or _missing_tracepoints(self.required)
                or self.missing_fields())

    def cflags(self, filters: Filters) -> list[str]:
        flags = super().cflags(filters) + ["-DSUNRPC_GROUP"]   # bpf/nfs.c: an I/O's start goes to its RPC's row
        # the steps rpc_task_run_action looks a task up at (bpf/sunrpc.c): the waits' starts
        addrs = _kallsyms({"call_reserve", "call_transmit"}, "sunrpc")
        if kernel.tracepoint_exists("sunrpc", "rpc_task_run_action"):
            flags += [f"-D{name.upper()}_ADDR={addr:#x}ULL" for name, addr in addrs.items()]
        return flags


class NfsProbes(ProbeGroup):
    name = "nfs"
    description = "WRITE/COMMIT/READ sizes, offsets and stability (nfs:* tracepoints)"
    source = "nfs.c"
    rings = {"nfs_ring": (NFS_EVENT, 1024)}   # sized as the sunrpc rings, for the same reason
    streams = (Stream("nfs_io", ("nfs_ring",), lambda d, ev: nfs_table(ev), stateless=True),)
    required = [("nfs", ev) for ev in ("nfs_initiate_write", "nfs_writeback_done",
                                       "nfs_initiate_commit", "nfs_commit_done")]
    # The NFS client's entry points whose time inside a traced syscall is added to its record
    # (bpf/nfs.c): each one's _enter and _exit, compiled only with the syscalls group.
    calls = {"nfs_fsync": "fsync", "nfs_writeback_inode": "the flush of close()", "nfs_getattr": "getattr"}
    optional_tracepoints = (("nfs", "nfs_initiate_read"), ("nfs", "nfs_readpage_done"),
                            *(("nfs", f"{call}_enter") for call in calls))
    gives = {"nfs_initiate_read": "READ offsets and sizes", "nfs_readpage_done": "READ completions and status",
             **{f"{call}_enter": f"the time a syscall spent in NFS's {what}" for call, what in calls.items()}}
    # The RPC status of a completion: `status` up to 5.10, `error` from 5.11.
    field_variants = tuple(("nfs", ev, ("error", "status"))
                           for ev in ("nfs_writeback_done", "nfs_commit_done", "nfs_readpage_done"))

    def can_run(self) -> str | None:
        return (common_reason() or module_reason("nfs", "nfs") or _missing_tracepoints(self.required)
                or self.missing_fields())

    def attach_points(self, together: set[str]) -> dict[str, str]:
        points = super().attach_points(together)
        for call in self.calls:
            if (what := points.pop(f"nfs:{call}_enter", None)) is not None and "syscalls" in together:
                points |= {f"nfs:{call}_{side}": what for side in ("enter", "exit")}
        return points


def member_macro(struct: str, path: str) -> str:
    """The name a program reads a struct member by (KREAD in bpf/members.h): rpc_xprt's
    backlog.qlen is RPC_XPRT_BACKLOG_QLEN, placed by RPC_XPRT_BACKLOG_QLEN_OFF and _SIZE."""
    return f"{struct}_{path.replace('.', '_')}".upper()


class KprobeGroup(ProbeGroup):
    """A group of kprobes that read struct members: it needs kprobes, its functions, and where
    this kernel puts each member. That comes from the kernel's BTF (vmlinux's and the module's
    own), handed to the program as numbers: no kernel header is compiled, so a kernel whose
    headers BCC cannot compile (7.3's with BCC 0.31) still loads the group. A kernel without
    BTF for the module (before 5.11) has it placed by its own headers, compiled with the group."""
    module = ""                              # whose tracepoints say the module is there, whose BTF
    functions: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()            # what defines the structs read, for a kernel without their BTF
    members: tuple[tuple[str, str], ...] = ()   # (struct, member path) the program reads
    # (header, struct, member, what the program does without it): -DHAVE_<STRUCT>_<MEMBER>
    # where this kernel has it
    optional_members: tuple[tuple[str, str, str, str], ...] = ()
    loses = ""                               # what a recording lacks without the group

    def btf(self) -> btf.Btf | None:
        """The kernel's BTF for the structs the group reads, or None where it has none for the
        module (then its headers place the members). BtfError where it is there but unreadable."""
        return btf.kernel_btf(self.module) if btf.has_module_btf(self.module) else None

    def _placed(self) -> dict[tuple[str, str], tuple[str, str] | None]:
        """Each member's offset and size: numbers from BTF, or C expressions over the headers;
        None for one this kernel lacks."""
        types, out = self.btf(), {}
        optional = {(struct, member): header for header, struct, member, _ in self.optional_members}
        for struct, path in [*self.members, *optional]:
            if types is not None:
                try:
                    out[struct, path] = tuple(map(str, types.member(struct, path)))
                except btf.BtfError:
                    out[struct, path] = None
            elif (struct, path) not in optional or kernel.struct_has_member(optional[struct, path], struct, path):
                out[struct, path] = (f"__builtin_offsetof(struct {struct}, {path})",
                                     f"sizeof(((struct {struct} *)0)->{path})")
            else:
                out[struct, path] = None
        return out

    def _optional(self) -> list[tuple[str, str, str, bool]]:
        """(struct, member, without it, whether this kernel has it) of each optional member."""
        placed = self._placed()
        return [(struct, member, without, placed[struct, member] is not None)
                for _, struct, member, without in self.optional_members]

    def fallbacks(self) -> list[str]:
        notes = super().fallbacks()
        if self.btf() is None:
            notes.append(f"no BTF for the {self.module} module (/sys/kernel/btf/{self.module}: 5.11+): "
                         f"struct members placed by the kernel's headers, compiled with the group")
        return notes + [f"struct {struct} has no `{member}`: {without}"
                        for struct, member, without, has in self._optional() if not has]

    def attach_points(self, together: set[str]) -> dict[str, str]:
        return super().attach_points(together) | {f"{KPROBE}{fn}": self.loses for fn in self.functions}

    def can_run(self) -> str | None:
        reason = common_reason() or module_reason(self.module, self.module)
        if reason:
            return reason
        if not kernel.kprobes_available():
            return "this kernel has no kprobes (no kprobe_events in tracefs: CONFIG_KPROBES off)"
        missing = kernel.missing_kprobe_functions(self.functions)
        if missing:
            return f"cannot kprobe {', '.join(missing)} (not in available_filter_functions)"
        return self.missing_members()

    def missing_members(self) -> str | None:
        """Why this kernel cannot place the members the group reads, and what is lost; None if it can."""
        try:
            types = self.btf()
        except btf.BtfError as exc:
            return f"{exc}; lost: {self.loses}"
        if types is None:
            if kernel.headers_match_kernel():
                return None
            return (f"no BTF for the {self.module} module, and the kernel headers "
                    f"({os.path.realpath(kernel.headers_dir() or '')}) are not this kernel's own: struct "
                    f"members would be read at wrong offsets; lost: {self.loses}")
        absent = []
        for struct, path in self.members:
            try:
                types.member(struct, path)
            except btf.BtfError as exc:
                absent.append(str(exc))
        return f"{'; '.join(absent)}; lost: {self.loses}" if absent else None

    def program_text(self) -> str:
        includes = "" if self.btf() else "".join(f"#include <{h}>\n" for h in self.headers)
        return includes + super().program_text()

    def cflags(self, filters: Filters) -> list[str]:
        flags = super().cflags(filters)
        if self.btf() is None:
            flags += [f"-DOPAQUE_{name.upper()}" for name in kernel.bpf_structs_bcc_lacks()]
        for (struct, path), where in self._placed().items():
            if where:
                name = member_macro(struct, path)
                flags += [f"-D{name}_OFF={where[0]}", f"-D{name}_SIZE={where[1]}"]
        return flags + [f"-DHAVE_{member_macro(struct, member)}" for struct, member, _, has in self._optional() if has]


class OwnerProbes(KprobeGroup):
    name = "nfs_owner"
    description = ("whose pages background writeback sends: each WRITE's lock owner and open file "
                   "(kprobes on nfs_file_write, nfs_initiate_write)")
    source = "owners.c"
    rings = {"owner_ring": (OWNER_EVENT, 64)}
    streams = (Stream("owners", ("owner_ring",), lambda d, ev: owners_table(ev), stateless=True),)
    module = "nfs"
    functions = ("nfs_file_write", "nfs_initiate_write")
    headers = ("linux/fs.h", "linux/sched.h", "linux/nfs_fs.h", "linux/nfs_xdr.h")
    members = (("task_struct", "files"), ("kiocb", "ki_filp"), ("nfs_pgio_header", "args.lock_context"),
               ("nfs_pgio_header", "args.context"), ("nfs_lock_context", "lockowner"),
               ("nfs_open_context", "flock_owner"), ("nfs_open_context", "lock_context"),
               ("nfs_open_context", "lock_context.lockowner"))
    loses = "each WRITE's lock owner and open file (background writeback is attributed by inode and time)"

    def cflags(self, filters: Filters) -> list[str]:
        return [*super().cflags(filters), "-DNFS_OWNER_GROUP"]   # bpf/nfs.c: the WRITE's entry is there


class XprtProbes(KprobeGroup):
    """Loaded with the sunrpc group only: it notes each task's transport in that group's map."""
    name = "xprt"
    description = ("each transport's slot counters (num_reqs, max_reqs, backlog) and which one each RPC "
                   "used (kprobes on xprt_reserve, xprt_free_slot; xprt_rdma_free_slot where rpcrdma is loaded)")
    source = "xprt.c"
    rings = {"xprt_ring": (XPRT_EVENT, 1024)}   # sized as the sunrpc rings, for the same reason
    streams = (Stream("xprt", ("xprt_ring",), lambda d, ev: xprt_table(ev, d.clients), stateless=True),)
    needs = "sunrpc"
    module = "sunrpc"
    functions = ("xprt_reserve", "xprt_free_slot")
    headers = ("linux/sunrpc/clnt.h", "linux/sunrpc/sched.h", "linux/sunrpc/xprt.h")
    members = (("rpc_task", "tk_xprt"), ("rpc_task", "tk_client"), ("rpc_task", "tk_pid"),
               ("rpc_clnt", "cl_clid"), ("rpc_rqst", "rq_task"),
               ("rpc_xprt", "num_reqs"), ("rpc_xprt", "max_reqs"), ("rpc_xprt", "min_reqs"),
               ("rpc_xprt", "backlog.qlen"))
    optional_members = (("linux/sunrpc/xprt.h", "rpc_xprt", "id",
                         "a transport is named by its address instead (no rpc_xprt.id before 5.15): its rows "
                         "are told apart, but not matched with /sys/kernel/sunrpc's xprt-ID"),)
    loses = "each transport's slot counters (the xprt table) and each RPC's transport (xprt_id -1)"
    # Probed where the kernel has them (-> the flag bpf/xprt.c compiles them with, and what each gives):
    # where RDMA transports give slots back (rpcrdma, if loaded); where a transport is freed
    # (without it, each request reads its transport's id).
    optional_functions = {"xprt_rdma_free_slot": ("XPRT_RDMA_FREE_SLOT", "the slot counters of RDMA transports"),
                          "xprt_free": ("XPRT_FREE_PROBED", "each transport's id kept, not read at each request")}

    @functools.cached_property
    def _probeable(self) -> list[str]:
        """The optional functions here, looked up once: the program's flags and the attach plan must agree."""
        missing = kernel.missing_kprobe_functions(tuple(self.optional_functions))
        return [name for name in self.optional_functions if name not in missing]

    def cflags(self, filters: Filters) -> list[str]:
        return [*super().cflags(filters), "-DXPRT_GROUP",
                *(f"-D{self.optional_functions[name][0]}" for name in self._probeable)]

    def attach_points(self, together: set[str]) -> dict[str, str]:
        return super().attach_points(together) | {f"{KPROBE}{name}": self.optional_functions[name][1]
                                                  for name in self._probeable}


# Every probe group, the syscall group (which every recording needs) first.
GROUPS = (SyscallProbes, SunrpcProbes, NfsProbes, OwnerProbes, XprtProbes)


def runnable_groups() -> tuple[list[ProbeGroup], dict[str, str]]:
    """The probe groups that can run here, and why each other one cannot (a group that loads
    with another is left out with it)."""
    groups, skipped = [], {}
    for make in GROUPS:
        group = make()
        why = group.can_run()
        if group.needs and group.needs in skipped:
            why = f"needs the {group.needs} group"
        if why:
            skipped[group.name] = why
        else:
            groups.append(group)
    return groups, skipped


def program(groups: list[ProbeGroup], filters: Filters) -> tuple[str, list[str]]:
    """The C text and compiler flags that load() hands to BCC for these groups."""
    bpf_dir = resources.files("slotscope.bpf")
    text = c_header() + bpf_dir.joinpath("common.h").read_text()
    kprobe_groups = [g for g in groups if isinstance(g, KprobeGroup)]
    if kprobe_groups:
        text += bpf_dir.joinpath("members.h").read_text()
    if any(g.btf() is None for g in kprobe_groups):   # the kernel's headers are compiled
        text += bpf_dir.joinpath("opaque.h").read_text()
    text += "".join(g.program_text() for g in groups)
    flags = [flag for g in groups for flag in g.cflags(filters)]
    return text, flags + (aggregates.cflags() if filters.aggregate else [])


def ebpf_text(groups: list[ProbeGroup], filters: Filters, skipped: dict[str, str]) -> str:
    """What `--ebpf` prints, as BCC's tools do: the program load() would compile, its -D flags
    written as #defines so that the text stands alone, and the groups left out with why."""
    text, cflags = program(groups, filters)
    head = [f"/* slotscope: probe groups {', '.join(g.name for g in groups)} */"]
    head += [f"/* not loaded: {name}: {why} */" for name, why in skipped.items()]
    for flag in cflags:   # every flag the groups make is a -DNAME[=VALUE]
        name, _, value = flag.removeprefix("-D").partition("=")
        head.append(f"#define {name} {value or 1}")
    return "\n".join(head) + "\n" + text


def load(groups: list[ProbeGroup], filters: Filters) -> "Loaded":
    from bcc import BPF  # only here: importing bcc is the agent's business alone

    text, cflags = program(groups, filters)
    bpf = BPF(text=text.encode(), cflags=cflags)
    loaded = Loaded(bpf, groups, watch=filters.aggregate)
    for tgid in filters.tgids:
        loaded.trace_tgid(tgid)
    for dev in filters.devs or ():
        bpf[b"traced_devs"][ctypes.c_uint64(dev)] = ctypes.c_uint8(1)
    if "env_ring" in loaded.rings:
        names = bpf[b"rank_vars"]
        for name in RANK_VARS:      # the only variables the kernel side passes on
            key = names.Key()
            key.name = name.encode()
            names[key] = ctypes.c_uint8(1)
    if filters.cgroup:
        fd = os.open(filters.cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            bpf[b"cgroup_filter"][0] = fd
        finally:
            os.close(fd)
    release_compiler()
    return loaded


def load_falling_back(groups: list[ProbeGroup], filters: Filters, skipped: dict[str, str],
                      say: Callable[[str], None]) -> tuple["Loaded", list[ProbeGroup]]:
    """Load the groups; when that fails, retry without the kprobe groups (they read struct
    members, and compile the kernel's headers where it has no BTF: the likeliest to break),
    then with syscalls alone: the optional groups must not cost the syscall view. The groups
    dropped go into `skipped` with why. -> (the program, the groups in it)."""
    attempts = []
    for attempt in (groups, [g for g in groups if not isinstance(g, KprobeGroup)], groups[:1]):
        if attempt not in attempts:
            attempts.append(attempt)
    for attempt, fallback in zip(attempts, attempts[1:]):
        try:
            return load(attempt, filters), attempt
        except Exception as exc:  # BCC reports compile and attach errors as plain exceptions
            dropped = [g for g in attempt if g not in fallback]
            for g in dropped:
                skipped[g.name] = f"failed to load: {exc}"
            say(f"the probes failed to load ({exc}); retrying without {', '.join(g.name for g in dropped)}")
    return load(attempts[-1], filters), attempts[-1]


def enable_bpf_stats() -> int | None:
    """A BPF_ENABLE_STATS fd: the kernel's BPF run-time statistics are on while it is open (and
    any other holder's); None where they cannot be turned on (no libbpf 1 beside BCC, before 5.8)."""
    try:
        fd = ctypes.CDLL("libbpf.so.1", use_errno=True).bpf_enable_stats(BPF_STATS_RUN_TIME)
    except (OSError, AttributeError):
        return None
    return fd if fd >= 0 else None


class Loaded:
    """The running program: its rings, loss counters and fd-ignore marks."""

    def __init__(self, bpf, groups: list[ProbeGroup], watch: bool = False):
        from bcc.libbcc import lib
        self.bpf = bpf
        self._lib = lib
        self.groups = [g.name for g in groups]
        self.syscalls = next((g.available_syscalls() for g in groups if isinstance(g, SyscallProbes)), [])
        self.rings = {name: RingReader(bpf[name.encode()].map_fd, pages * PAGE, layout)
                      for g in groups for name, (layout, pages, _) in ring_sizes(g, watch).items()}
        self._loss = bpf[b"loss"]
        self._fd_gen = self._fd_ignore = None
        self._fdinfo: dict[str, int] | None = None    # our programs' fdinfo files (program_runtime)
        if any(isinstance(g, SyscallProbes) for g in groups):
            self._fd_gen, self._fd_ignore = bpf[b"fd_gen"].map_fd, bpf[b"fd_ignore"].map_fd
        # Edge-triggered: only the kernel's forced wakeups end a wait, not events that
        # arrived without one (level-triggered, any unread event would).
        self._epoll = select.epoll()
        self.priority = DrainPriority()
        self._last_read = time.monotonic()
        for ring in self.rings.values():
            self._epoll.register(ring.fd, select.EPOLLIN | select.EPOLLET)
        self.priority.guard([ring.fd for ring in self.rings.values()],
                            lambda: filling(self.fill(), time.monotonic() - self._last_read))
        self._stats_fd: int | None = None

    def measure_programs(self) -> None:
        """The kernel's BPF run-time statistics on until close(), for program_runtime. They are the
        whole machine's: every BPF program on it, ours and others', then reads the clock twice a
        run (a third of what ours cost a WRITE on the VM bench is runs that return at once). On
        while a BPF_ENABLE_STATS fd is open (5.8), not by writing kernel.bpf_stats_enabled: the
        kernel counts the holders, so two agents do not turn them off under each other, and an
        agent killed leaves them as it found them."""
        self._stats_fd = enable_bpf_stats()

    def attached(self) -> set[str]:
        """The points BCC attached the program to, named as attach_points names them. BCC keeps a
        kprobe under its event name, p_<function>."""
        return ({tp.decode() for tp in self.bpf.tracepoint_fds}
                | {KPROBE + ev.decode().removeprefix("p_") for ev in self.bpf.kprobe_fds})

    def read_batch(self) -> dict[str, np.ndarray]:
        """Every ring's new events. The syscall ring's position is taken first: paths
        and process events that precede a syscall are then in the same batch or an
        earlier one. A ring read stops at a record still being written (another CPU's, or a
        program preempted in a faultable syscall tracepoint), and the records after it wait;
        so when one of the rings the syscalls refer to stopped short, this batch reads no
        syscall at all: one whose path or fork were held back would be decoded without them
        (an open without its path leaves every write to that fd unnamed)."""
        now = time.monotonic()
        if self.rings:
            self.priority.follow(self.fill(), now - self._last_read, now)
        self._last_read = now
        sys_ring = self.rings.get("sys_ring")
        upto = sys_ring.producer_position() if sys_ring else None
        out = {name: ring.read() for name, ring in self.rings.items() if name != "sys_ring"}
        if sys_ring:
            complete = all(self.rings[name].caught_up for name in SYS_REFERS_TO if name in self.rings)
            out["sys_ring"] = sys_ring.read(upto) if complete else np.empty(0, SYS_EVENT.dtype)
            sys_ring.caught_up = complete and sys_ring.caught_up
        return out

    @property
    def syscalls_caught_up(self) -> bool:
        """Whether the last batch read every syscall record committed before its process
        events were read (then the last calls of a process whose exit it saw are all read)."""
        ring = self.rings.get("sys_ring")
        return ring is None or ring.caught_up

    def fill(self) -> float:
        return max(ring.fill() for ring in self.rings.values())

    def wake_on(self, fd: int) -> None:
        """End waits also when `fd` becomes readable (the recorder's signal pipe); the
        caller reads it."""
        self._epoll.register(fd, select.EPOLLIN)

    def wait(self, longest: float = DRAIN_EVERY) -> bool:
        """Until the next drain is due (see DRAIN_EVERY). -> whether it is due early: at the
        kernel's request, because a ring is filling, or a wake_on fd is readable."""
        if self.fill() >= BUSY_FILL:
            return True
        self.priority.sleeping()
        time.sleep(min(DRAIN_MIN, longest))
        return self.asked(max(0.0, longest - DRAIN_MIN))

    def asked(self, timeout: float) -> bool:
        """Whether the kernel asks for a drain (forces a wakeup) within `timeout` s."""
        return bool(self._epoll.poll(timeout))

    def forced_wakeups(self) -> dict[str, int]:
        """How many times the programs woke the agent, per ring (bpf/common.h wake_flags)."""
        woken = self.bpf[b"woken"]
        with unpreempted():
            return {ring: int(sum(woken[ctypes.c_int(i)])) for i, ring in enumerate(RINGS) if ring in self.rings}

    def loss_totals(self) -> dict[str, int]:
        with unpreempted():
            return {name: int(sum(self._loss[ctypes.c_int(i)])) for i, name in enumerate(LOSS_COUNTERS)}

    def ignore_fd(self, tgid: int, fd: int, gen: int | None) -> None:
        """Stop events for (tgid, fd) while it holds generation `gen`. gen=None is an fd
        opened before tracing began: it is marked only if no open/close happened since.
        A generation the fd has left is not marked: the mark would replace the one the
        kernel's --path filter set for the fd's newer file, and that file's calls, never
        named (its open was dropped in the kernel), would all come up as unnamed rows.
        Straight to libbpf: every file any process opens off the traced filesystems comes
        here once, and BCC's item assignment cost several times the update itself."""
        key = ctypes.c_uint64((tgid << 32) | (fd & 0xFFFFFFFF))
        if gen is None:
            # BPF_NOEXIST: if the kernel gave the fd a generation since, that one wins.
            if self._lib.bpf_update_elem(self._fd_gen, ctypes.byref(key), ctypes.byref(ctypes.c_uint64(1)),
                                         BPF_NOEXIST):
                return
            gen = 1
        else:
            current = ctypes.c_uint64()
            if self._lib.bpf_lookup_elem(self._fd_gen, ctypes.byref(key), ctypes.byref(current)) == 0 \
                    and current.value != gen:
                return
        self._lib.bpf_update_elem(self._fd_ignore, ctypes.byref(key), ctypes.byref(ctypes.c_uint64(gen)), BPF_ANY)

    def trace_tgid(self, tgid: int) -> None:
        self.bpf[b"traced_tgids"][ctypes.c_uint32(tgid)] = ctypes.c_uint8(1)

    def _live_slots(self, name: bytes, hold: tuple[str, ...]) -> np.ndarray:
        """The entries of a direct-mapped array (bpf/common.h) whose slot_hold, at the member path
        `hold` of its value, is live: its values' bytes, one row each, read with one batch lookup
        into numpy (the array's thousands of entries as Python objects were a tenth of the agent's
        CPU under emulation, at one read a second)."""
        table = self.bpf[name]
        n = table.max_entries
        keys, values = (table.Key * n)(), (table.Leaf * n)()
        count, out = ctypes.c_uint32(n), ctypes.c_uint32(0)
        with unpreempted():     # a call of milliseconds under emulation, all of it in the kernel
            failed = self._lib.bpf_lookup_batch(table.map_fd, None, ctypes.byref(out), keys, values, ctypes.byref(count))
        if failed and ctypes.get_errno() != errno.ENOENT:    # ENOENT: the whole array was read
            raise OSError(ctypes.get_errno(), f"BPF_MAP_LOOKUP_BATCH on {name.decode()}")
        rows = np.frombuffer(values, np.uint8).reshape(n, ctypes.sizeof(table.Leaf))[: count.value]
        kind, offset = table.Leaf, 0
        for member in (*hold, "live"):
            field_ = getattr(kind, member)
            kind, offset = dict(kind._fields_)[member], offset + field_.offset
        return rows[rows[:, offset] != 0]

    def outstanding_rpcs(self) -> np.ndarray:
        """RPC tasks begun and not completed, as rpc_event records (complete = 0)."""
        if "rpc_ring" not in self.rings:
            return np.empty(0, RPC_EVENT.dtype)
        # bpf/sunrpc.c: a task's record is in the task_slots array (where `live`) or the rpc_tasks hash
        size = RPC_EVENT.dtype.itemsize
        slots = self._live_slots(b"task_slots", ("hold",))[:, :size].tobytes()
        hashed = b"".join(bytes(v)[:size] for v in self.bpf[b"rpc_tasks"].values())
        return np.frombuffer(slots + hashed, RPC_EVENT.dtype)

    def in_flight(self) -> tuple[np.ndarray, np.ndarray]:
        """(tids, INFLIGHT records) of the traced syscalls entered and not yet returned."""
        if "sys_ring" not in self.rings:      # the syscalls group is not loaded
            return np.empty(0, np.uint32), np.empty(0, INFLIGHT.dtype)
        # bpf/syscalls.c: a call is in the inflight_slots array (where `live`) or the inflight hash
        size = INFLIGHT.dtype.itemsize
        slots = self._live_slots(b"inflight_slots", ("head", "hold"))
        tid_at = self.bpf[b"inflight_slots"].Leaf.head.offset     # struct thread_hold starts with its tid
        hashed = list(self.bpf[b"inflight"].items())
        tids = np.concatenate([slots[:, tid_at:tid_at + 4].copy().view(np.uint32).ravel(),
                               np.array([k.value for k, _ in hashed], np.uint32)])
        records = slots[:, :size].tobytes() + b"".join(bytes(v)[:size] for _, v in hashed)
        return tids, np.frombuffer(records, INFLIGHT.dtype)

    def program_runtime(self) -> dict[str, dict[str, int]]:
        """Per program: how often it ran and for how long (ns) since it was loaded; empty
        unless measure_programs() turned the statistics on. Their fdinfo files are opened
        once and re-read: opening ~40 of them was most of an idle agent's CPU under emulation."""
        if self._stats_fd is None:
            return {}
        if self._fdinfo is None:
            self._fdinfo = {}
            for name, fn in self.bpf.funcs.items():
                try:
                    self._fdinfo[name.decode()] = os.open(f"/proc/self/fdinfo/{fn.fd}", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue
        out = {}
        for name, fd in self._fdinfo.items():
            fields = dict(line.split(b":", 1) for line in os.pread(fd, 4096, 0).splitlines() if b":" in line)
            out[name] = {"run_cnt": int(fields.get(b"run_cnt", 0)), "run_ns": int(fields.get(b"run_time_ns", 0))}
        return out

    def close(self) -> None:
        self.priority.close()
        if self._stats_fd is not None:
            os.close(self._stats_fd)
        for fd in (self._fdinfo or {}).values():
            os.close(fd)
        self._epoll.close()
        for ring in self.rings.values():
            ring.close()
        self.bpf.cleanup()
