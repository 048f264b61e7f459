"""Facts about the running kernel that decide which probes can load, read without bcc."""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import re
import subprocess

TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def tracefs() -> str | None:
    for path in TRACEFS_CANDIDATES:
        if os.path.isdir(os.path.join(path, "events")):
            return path
    return None


def ensure_tracefs() -> str | None:
    """Mount tracefs if it is not (needs root). bcc picks its tracefs path at import: call this first."""
    found = tracefs()
    if found or os.geteuid() != 0:
        return found
    subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS_CANDIDATES[0]],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return tracefs()


def tracepoint_exists(category: str, event: str) -> bool:
    base = tracefs()
    return bool(base) and os.path.isdir(os.path.join(base, "events", category, event))


@functools.cache   # a format file does not change while the module stays loaded
def tracepoint_fields(category: str, event: str) -> dict[str, str]:
    """The tracepoint's fields as BCC will see them: name -> C type, from its format file
    (empty if there is none). Kernels rename fields (nfs_writeback_done's `status` became
    `error` in 5.11) and change their types (an enum the program must then define)."""
    try:
        with open(os.path.join(tracefs() or "", "events", category, event, "format")) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        decl = line.strip().partition(";")[0]
        if not decl.startswith("field:"):
            continue
        ctype, _, name = decl.removeprefix("field:").rpartition(" ")
        fields[name.split("[")[0]] = ctype
    return fields


# bpf(2)'s number where it differs between architectures (the agent needs no bcc for this)
BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
BPF_MAP_CREATE = 0
BPF_MAP_TYPE_RINGBUF = 27


@functools.cache   # every probe group's can_run asks; the kernel's answer does not change
def bpf_ringbuf_supported() -> bool | None:
    """Whether this kernel has BPF ring buffers (5.8+, or a backport). None where it cannot
    tell (an unknown architecture, no privilege, a memlock limit): the load then reports
    what really fails."""
    return _map_creatable(BPF_MAP_TYPE_RINGBUF)


def _map_creatable(map_type: int) -> bool | None:
    """Whether a one-page map of this type can be created; EINVAL says the kernel does not know
    the type (or wants a key and value)."""
    err = _map_create_errno(map_type)
    return True if err == 0 else False if err == errno.EINVAL else None


def _map_create_errno(map_type: int) -> int | None:
    """Create a one-page map of this type without key or value, as a ring buffer is, and close
    it: -> 0, or the errno of the failure (None on an architecture this does not know)."""
    nr = BPF_SYSCALL.get(platform.machine())
    if nr is None:
        return None
    attr = (ctypes.c_uint32 * 32)()   # union bpf_attr: map_type, key_size, value_size, max_entries; rest zero
    attr[0], attr[3] = map_type, os.sysconf("SC_PAGE_SIZE")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_long(BPF_MAP_CREATE), attr, ctypes.c_long(ctypes.sizeof(attr)))
    if fd >= 0:
        os.close(fd)
        return 0
    return ctypes.get_errno()


# Capability bits (linux/capability.h): tracing programs need CAP_BPF and CAP_PERFMON (5.8+), or
# CAP_SYS_ADMIN (which held them both before).
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


def effective_capabilities(status: str | None = None) -> int:
    """The CapEff mask of this process (from /proc/self/status, or the text given)."""
    if status is None:
        with open("/proc/self/status") as f:
            status = f.read()
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def may_trace(caps: int) -> bool:
    """Whether a capability mask lets a process load tracing programs."""
    return bool(caps >> CAP_SYS_ADMIN & 1 or (caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1))


def bpf_privilege_missing() -> str | None:
    """Why this process may not load tracing programs, or None: capabilities are checked, not the
    uid (root in a container may lack them; a user may hold them), then the bpf() call itself,
    which a seccomp filter or a user namespace refuses with EPERM whatever the capabilities."""
    if not may_trace(effective_capabilities()):
        return "needs root (CAP_BPF and CAP_PERFMON): run with sudo"
    if _map_create_errno(BPF_MAP_TYPE_RINGBUF) == errno.EPERM:
        return "the bpf() system call is refused (EPERM) despite the capabilities: a seccomp filter or a container"
    return None


def headers_dir() -> str | None:
    build = f"/lib/modules/{os.uname().release}/build"
    return build if os.path.isdir(os.path.join(build, "include")) else None


def headers_match_kernel() -> bool:
    """True when the build tree is the running kernel's own (not a linked fallback)."""
    build = headers_dir()
    if not build:
        return False
    return os.uname().release in os.path.realpath(build)


def kprobes_available() -> bool:
    base = tracefs()
    return bool(base) and os.path.exists(os.path.join(base, "kprobe_events"))


def missing_kprobe_functions(names: tuple[str, ...]) -> list[str]:
    """Which of these kernel functions cannot take a kprobe (not in available_filter_functions:
    inlined, renamed, or in a module that is not loaded)."""
    base = tracefs()
    try:
        with open(os.path.join(base or "", "available_filter_functions"), "rb") as f:
            listed = b"\n" + f.read()
    except OSError:
        return list(names)
    # Searched whole, not split into a set: the file has ~60,000 lines ("name" or "name [module]"),
    # and splitting them took the agent's start 3.4 s a call under the VM rig's emulation.
    return [n for n in names if not re.search(b"\n" + re.escape(n.encode()) + b"[ \n]", listed)]


# Structs that a newer kernel's internal linux/bpf.h takes the size of, and that an older
# BCC's own copy of the uapi bpf.h does not define (BCC 0.26 with 6.12 headers): a program
# including that header needs them defined first.
OPAQUE_BPF_STRUCTS = ("bpf_wq", "bpf_rb_root", "bpf_rb_node", "bpf_refcount")


def header_text(path: str) -> str | None:
    """A header of the running kernel's tree (path under include/): Debian keeps the arch
    build tree and the common source tree apart."""
    release = os.uname().release
    for tree in (f"/lib/modules/{release}/build", f"/lib/modules/{release}/source"):
        try:
            with open(os.path.join(tree, "include", path)) as f:
                return f.read()
        except OSError:
            continue
    return None


def struct_has_member(header: str, struct: str, member: str) -> bool | None:
    """Whether the running kernel's headers give `struct` a member `member` (at its top
    level); None when the header or the struct is not there. Members come and go between
    versions (rpc_xprt.id arrived in 5.15): look before compiling a program that reads one."""
    text = header_text(header)
    start = text.find(f"struct {struct} {{") if text else -1
    if start < 0:
        return None
    depth, top = 0, []
    for ch in text[start:]:
        depth += (ch == "{") - (ch == "}")
        if depth == 1:
            top.append(ch)
        if depth == 0 and top:
            break
    return re.search(rf"[\s*]{re.escape(member)}\s*(\[[^]]*\])?\s*;", "".join(top)) is not None


def bpf_structs_bcc_lacks() -> list[str]:
    """Which OPAQUE_BPF_STRUCTS the kernel headers use and the loaded libbcc lacks (its
    compat headers are strings inside the library). Call with bcc imported."""
    used = header_text(os.path.join("linux", "bpf.h")) or ""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "/libbcc.so" in line}
        blob = b"".join(open(path, "rb").read() for path in libs)
    except OSError:
        return []
    return [name for name in OPAQUE_BPF_STRUCTS
            if f"struct {name}" in used and f"struct {name} {{".encode() not in blob]


def kernel_module_loaded(name: str) -> bool:
    return os.path.isdir(f"/sys/module/{name}")


def bcc_import_error() -> str | None:
    try:
        import bcc  # noqa: F401
    except Exception as exc:  # the distribution package may be missing or broken
        return f"{type(exc).__name__}: {exc}"
    return None
