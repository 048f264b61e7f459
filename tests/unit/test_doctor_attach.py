"""`doctor --load` compares each loaded group's plan, the attach points it expects on this kernel,
with what attached: one line per group, and the points that did not attach named below it with
what a recording loses without them. On the syscall group's plan for this machine's tracefs."""
import pytest

from slotscope.agent import kernel
from slotscope.agent.attach_plan import compare
from slotscope.agent.doctor import GROUP, report
from slotscope.agent.probes import NfsProbes, SyscallProbes

pytestmark = pytest.mark.unit


def syscalls():
    if not kernel.tracepoint_exists("syscalls", "sys_exit_fsync"):
        pytest.skip("no syscalls:sys_exit_fsync tracepoint here (tracefs not mounted, or not root)")
    return SyscallProbes()


def test_the_syscall_groups_plan_names_each_traced_call_and_the_process_lifecycle():
    plan = syscalls().attach_points({"syscalls"})
    assert plan["syscalls:sys_enter_fsync"] == plan["syscalls:sys_exit_fsync"] == "fsync() calls"
    assert plan["task:task_newtask"].startswith("forks:") and "sched:sched_process_exit" in plan
    assert len(plan) == 2 * len(SyscallProbes().available_syscalls()) + len(SyscallProbes.required)


def test_a_point_that_did_not_attach_is_named_under_its_groups_line_with_what_is_lost():
    group = syscalls()
    attached = set(group.attach_points({"syscalls"})) - {"syscalls:sys_exit_fsync"}
    plans, unplanned = compare([group], attached | {"kprobe:vfs_fsync"})
    assert plans["syscalls"].missing() == ["syscalls:sys_exit_fsync"] and unplanned == ["kprobe:vfs_fsync"]
    expected = len(plans["syscalls"].expected)
    lines = report([("root", None, "privileges"), (f"{GROUP}syscalls", None, "file syscalls"),
                    (f"{GROUP}nfs", "no nfs here", "NFS I/O")], plans, unplanned)
    assert lines == [
        "ok  root                  privileges",
        f"!!  probe group syscalls  file syscalls; attached {expected - 1} of {expected} expected points",
        "                          not attached: syscalls:sys_exit_fsync (lost: fsync() calls)",
        "NO  probe group nfs       no nfs here",
        "!!  attach points         attached, but expected by no group: kprobe:vfs_fsync",
    ]
    everything = compare([group], set(group.attach_points({"syscalls"})))[0]["syscalls"]
    assert everything.missing() == [] and everything.summary() == f"attached {expected} of {expected} expected points"


def test_the_nfs_calls_timed_inside_a_syscall_are_expected_only_with_the_syscall_group():
    class EveryTracepoint(NfsProbes):    # as on a kernel that has each one the group reads
        def tracepoints(self):
            return [*self.required, *self.optional_tracepoints]

    alone, with_syscalls = (EveryTracepoint().attach_points(together) for together in ({"nfs"}, {"nfs", "syscalls"}))
    assert "nfs:nfs_initiate_read" in alone and not any(p.startswith("nfs:nfs_fsync") for p in alone)
    assert sorted(set(with_syscalls) - set(alone)) == [
        f"nfs:{call}_{side}" for call in ("nfs_fsync", "nfs_getattr", "nfs_writeback_inode")
        for side in ("enter", "exit")]
    assert with_syscalls["nfs:nfs_fsync_exit"] == "the time a syscall spent in NFS's fsync"


def test_the_xprt_groups_optional_functions_are_expected_and_compiled_only_where_they_can_be_probed(monkeypatch):
    """The xprt group samples at xprt_free_slot; RDMA transports give their slots back through
    rpcrdma's xprt_rdma_free_slot, and xprt_free clears a freed transport's kept id: each is
    probed (and planned, and compiled) only where this kernel can kprobe it."""
    from slotscope.agent.probes import Filters, XprtProbes
    flags = {"xprt_rdma_free_slot": "-DXPRT_RDMA_FREE_SLOT", "xprt_free": "-DXPRT_FREE_PROBED"}
    for probeable in (set(), {"xprt_rdma_free_slot"}, {"xprt_free"}, set(flags)):
        monkeypatch.setattr(kernel, "missing_kprobe_functions", lambda names: [n for n in names if n not in probeable])
        group = XprtProbes()
        plan, cflags = set(group.attach_points({"sunrpc", "xprt"})), group.cflags(Filters())
        assert {"kprobe:xprt_reserve", "kprobe:xprt_free_slot"} <= plan
        for name, flag in flags.items():
            assert (f"kprobe:{name}" in plan) == (name in probeable) == (flag in cflags), (name, probeable)


def test_kprobe_functions_are_found_by_whole_name_built_in_or_in_a_module(tmp_path, monkeypatch):
    """available_filter_functions lists "name" or "name [module]" a line: a function is there only
    under its whole name (xprt_reserve is not xprt_reserve_xprt, nor a prefix of it)."""
    (tmp_path / "available_filter_functions").write_text(
        "vfs_fsync\nxprt_reserve_xprt [sunrpc]\nxprt_free_slot [sunrpc]\nnfs_file_write [nfs]\n")
    monkeypatch.setattr(kernel, "tracefs", lambda: str(tmp_path))
    names = ("vfs_fsync", "xprt_free_slot", "nfs_file_write", "xprt_reserve", "vfs_fsyn", "free_slot")
    assert kernel.missing_kprobe_functions(names) == ["xprt_reserve", "vfs_fsyn", "free_slot"]
    monkeypatch.setattr(kernel, "tracefs", lambda: str(tmp_path / "none"))
    assert kernel.missing_kprobe_functions(("vfs_fsync",)) == ["vfs_fsync"]   # no file: none can be probed
