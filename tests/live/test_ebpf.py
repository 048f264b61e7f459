"""`record --ebpf` and `doctor --ebpf` print the program the agent would load, as BCC's tools do:
the text stands alone (the -D flags as #defines) and compiles and attaches as it is."""
import pytest

from livehelp import slotscope

pytestmark = pytest.mark.live


def test_record_ebpf_prints_a_program_that_loads_as_printed(bpf_ready):
    res = slotscope("record", "--ebpf", "--pid", "1")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "#define FILTER_TGIDS 1" in text and "#define SYSCALLS_GROUP 1" in text
    from bcc import BPF
    bpf = BPF(text=text.encode())       # no cflags: everything is in the text
    try:
        assert bpf.num_open_tracepoints() > 10      # sys_enter_/sys_exit_* of the traced calls
    finally:
        bpf.cleanup()


def test_the_filters_shape_the_printed_program(bpf_ready):
    """Without --pid, --cgroup or a command nothing is filtered by process: no FILTER_TGIDS or
    FILTER_CGROUP. The stats of devices without traced files are dropped (FILTER_DEVS) unless
    any filesystem is traced."""
    plain = slotscope("record", "--ebpf").stdout
    cgroup = slotscope("record", "--ebpf", "--cgroup", "/sys/fs/cgroup").stdout
    every_fs = slotscope("record", "--ebpf", "--fs", "any").stdout
    assert "#define FILTER_TGIDS" not in plain and "#define FILTER_CGROUP" not in plain
    assert "#define FILTER_DEVS 1" in plain and "#define FILTER_" not in every_fs
    assert "#define FILTER_CGROUP 1" in cgroup and "#define FILTER_TGIDS" not in cgroup
    doctor = slotscope("doctor", "--ebpf")
    assert doctor.returncode == 0 and "#define SYSCALLS_GROUP 1" in doctor.stdout


def test_watch_ebpf_prints_its_aggregates_and_record_has_none(bpf_ready):
    """watch's program is record's with the kernel's aggregates compiled in (-DAGGREGATE and
    their flags); it loads as printed. record's has no AGGREGATE defined."""
    res = slotscope("watch", "--ebpf", "--path", "/tmp")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "#define AGGREGATE 1" in text and "#define AGG_BUCKET(ns) ((ns)<=" in text
    assert "#define AGGREGATE" not in slotscope("record", "--ebpf", "--path", "/tmp").stdout
    from bcc import BPF
    bpf = BPF(text=text.encode())
    try:
        assert bpf.num_open_tracepoints() > 10 and len(bpf[b"agg_calls"]) == 0
    finally:
        bpf.cleanup()
