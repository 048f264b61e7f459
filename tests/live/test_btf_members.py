"""Struct members read at the offsets this kernel's BTF gives (agent/btf.py, KREAD in
bpf/members.h), as the kprobe groups read theirs, without any kernel header for the structs:
a program reads this process's task_struct and must find its pid, tgid, parent and name."""
import ctypes
import os
from importlib import resources

import pytest

from slotscope.agent import btf
from slotscope.agent.probes import KprobeGroup

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]


class TaskReader(KprobeGroup):
    name = "test"
    module = "test"
    members = (("task_struct", "pid"), ("task_struct", "tgid"), ("task_struct", "real_parent"),
               ("task_struct", "comm"))

    def btf(self):
        return btf.vmlinux()


def test_task_struct_members_read_at_btf_offsets():
    from bcc import BPF

    if not os.path.exists(os.path.join(btf.BTF_DIR, "vmlinux")):
        pytest.skip("this kernel has no BTF")
    text = resources.files("slotscope.bpf").joinpath("members.h").read_text() + f"""
struct seen {{ u64 pid_wide; u32 tgid; u32 parent_tgid; char comm[16]; }};
BPF_ARRAY(out, struct seen, 1);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {{
    if ((bpf_get_current_pid_tgid() >> 32) != {os.getpid()})
        return 0;
    int zero = 0;
    struct seen *s = out.lookup(&zero);
    if (!s)
        return 0;
    void *task = (void *)bpf_get_current_task(), *parent;
    s->pid_wide = ~0ULL;    /* a narrower member lands zero-extended */
    KREAD(s->pid_wide, task, TASK_STRUCT_PID);
    KREAD(s->tgid, task, TASK_STRUCT_TGID);
    KREAD(parent, task, TASK_STRUCT_REAL_PARENT);
    KREAD(s->parent_tgid, parent, TASK_STRUCT_TGID);
    KREAD(s->comm, task, TASK_STRUCT_COMM);
    return 0;
}}"""
    b = BPF(text=text.encode(), cflags=TaskReader().cflags(None))
    try:
        os.getppid()
        seen = b[b"out"][ctypes.c_int(0)]
        with open("/proc/self/comm") as f:
            comm = f.read().strip()
        assert (seen.pid_wide, seen.tgid, seen.parent_tgid) == (os.getpid(), os.getpid(), os.getppid())
        assert bytes(seen.comm).rstrip(b"\0").decode() == comm
    finally:
        b.cleanup()
