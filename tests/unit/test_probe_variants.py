"""A probe group finds at run time what this kernel calls the fields it reads (format files) and
whether a struct has a member (the kernel's headers), falls back, and says so: on this machine's
own tracefs and headers, with a group made for the test over the syscall tracepoints it has."""
import pytest

from slotscope.agent import kernel
from slotscope.agent.probes import ProbeGroup

pytestmark = pytest.mark.unit


def write_fields():
    fields = kernel.tracepoint_fields("syscalls", "sys_enter_write")
    if not fields:
        pytest.skip("no syscalls:sys_enter_write format here (tracefs not mounted, or not root)")
    return fields


class Group(ProbeGroup):
    name = "test"
    required = [("syscalls", "sys_enter_write")]


def test_format_file_fields_and_types():
    fields = write_fields()
    assert fields["fd"] == "unsigned int" and fields["count"] == "size_t"
    assert kernel.tracepoint_fields("syscalls", "no_such_event") == {}


def test_a_renamed_field_is_read_under_the_name_this_kernel_has():
    write_fields()

    class Renamed(Group):   # as nfs_writeback_done's `error`, called `status` before 5.11
        field_variants = (("syscalls", "sys_enter_write", ("bytes", "count")),)

    g = Renamed()
    assert "-DSYS_ENTER_WRITE_BYTES=count" in g.cflags(None)
    assert g.missing_fields() is None
    assert g.fallbacks() == ["syscalls:sys_enter_write: field `count` read for `bytes`"]

    class Current(Group):
        field_variants = (("syscalls", "sys_enter_write", ("count", "bytes")),)

    assert "-DSYS_ENTER_WRITE_COUNT=count" in Current().cflags(None) and Current().fallbacks() == []


def test_an_optional_tracepoint_this_kernel_lacks_is_said_with_what_is_lost():
    write_fields()

    class Optional(Group):    # as sunrpc:xprt_retransmit, 5.15+
        optional_tracepoints = (("syscalls", "sys_enter_write"), ("syscalls", "no_such_event"))
        gives = {"sys_enter_write": "writes", "no_such_event": "each RPC's retransmissions"}

    g = Optional()
    assert g.fallbacks() == ["no syscalls:no_such_event in this kernel: without each RPC's retransmissions"]
    assert "-DHAVE_sys_enter_write" in g.cflags(None) and "-DHAVE_no_such_event" not in g.cflags(None)


def test_every_optional_tracepoint_says_what_it_gives():
    from slotscope.agent.probes import GROUPS
    for group in GROUPS:
        assert all(ev in group.gives for _, ev in group.optional_tracepoints), group.name


def test_a_field_no_variant_of_which_exists_is_the_reason_the_group_cannot_run():
    write_fields()

    class Missing(Group):
        field_variants = (("syscalls", "sys_enter_write", ("bytes", "length")),)

    assert Missing().missing_fields() == "syscalls:sys_enter_write has no field bytes or length"


def test_struct_members_from_the_running_kernels_headers():
    if kernel.header_text("linux/sched.h") is None:
        pytest.skip("no kernel headers for the running kernel here")
    assert kernel.struct_has_member("linux/sched.h", "task_struct", "files") is True
    assert kernel.struct_has_member("linux/sched.h", "task_struct", "no_such_member") is False
    assert kernel.struct_has_member("linux/sched.h", "no_such_struct", "files") is None
