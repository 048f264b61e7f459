"""`doctor --load` loads what `record` would and compares each group's expected attach points with
what BCC attached. Here only the syscall group runs: every point of its plan attached, by name;
and a group whose plan expects a point its program lacks is caught, by a real load."""
import pytest

from livehelp import slotscope
from slotscope.agent.attach_plan import compare
from slotscope.agent.doctor import checks, load_check, report
from slotscope.agent.probes import Filters, SyscallProbes, load

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]


def test_doctor_load_attaches_every_point_the_syscall_group_expects():
    expected = SyscallProbes().attach_points({"syscalls"})
    res = slotscope("doctor", "--load")
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(line for line in res.stdout.splitlines() if "probe group syscalls" in line)
    assert line.startswith("ok ") and line.endswith(f"; attached {len(expected)} of {len(expected)} expected points")

    _, plans, unplanned = load_check(checks())
    assert plans["syscalls"].missing() == [] and unplanned == []
    if set(plans) == {"syscalls"}:     # as on a kernel without NFS: nothing else attached
        assert sorted(plans["syscalls"].attached) == sorted(expected)


class Misplanned(SyscallProbes):
    """Its plan (and -DHAVE_sys_enter_sync) has a tracepoint bpf/syscalls.c has no probe for."""
    optional_tracepoints = (("syscalls", "sys_enter_sync"),)


def test_a_point_the_program_lacks_is_named_as_not_attached():
    group = Misplanned()
    loaded = load([group], Filters())
    try:
        plans, unplanned = compare([group], loaded.attached())
    finally:
        loaded.close()
    assert plans["syscalls"].missing() == ["syscalls:sys_enter_sync"] and unplanned == []
    lines = report([("probe group syscalls", None, "file syscalls")], plans)
    assert lines[0].startswith("!!  probe group syscalls") and lines[1].strip() == (
        f"not attached: syscalls:sys_enter_sync (lost: {SyscallProbes.description})")
