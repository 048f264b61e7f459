"""Struct members placed by the kernel's BTF (agent/btf.py): on this machine's own
/sys/kernel/btf/vmlinux, and on a module-like split BTF built here (this kernel has no modules)."""
import os
import struct

import pytest

from slotscope.agent import btf
from slotscope.agent.probes import KprobeGroup

pytestmark = pytest.mark.unit


def vmlinux():
    if not os.path.exists(os.path.join(btf.BTF_DIR, "vmlinux")):
        pytest.skip("this kernel has no BTF (CONFIG_DEBUG_INFO_BTF off)")
    return btf.vmlinux()


def test_members_of_the_running_kernel():
    types = vmlinux()
    assert types.member("task_struct", "comm")[1] == 16          # TASK_COMM_LEN
    assert types.member("kiocb", "ki_filp") == (0, 8)            # its first member, a pointer
    assert types.member("list_head", "prev") == (8, 8)
    # A member of a member: the offsets add up.
    common, _ = types.member("sock", "__sk_common")
    family, size = types.member("sock_common", "skc_family")
    assert types.member("sock", "__sk_common.skc_family") == (common + family, size) and size == 2
    # Inside anonymous unions and structs, as C reaches it: struct page's lru follows its flags.
    assert types.member("page", "lru") == (8, 16)


def test_a_missing_member_or_struct_is_named():
    types = vmlinux()
    with pytest.raises(btf.BtfError, match=r"struct task_struct has no member `no_such` .*vmlinux"):
        types.member("task_struct", "no_such")
    with pytest.raises(btf.BtfError, match=r"struct sock has no member `__sk_common.no_such` "
                                           r"\(sock.__sk_common has no `no_such`\)"):
        types.member("sock", "__sk_common.no_such")
    with pytest.raises(btf.BtfError, match="has no struct no_such_struct"):
        types.member("no_such_struct", "x")


def encode(types: list[tuple], strings: list[str], first_str: int = 0) -> bytes:
    """A BTF blob: `types` as (name, kind, vlen, size_or_type, trailer bytes, kind_flag)."""
    table = b"\0" if first_str == 0 else b""
    offsets = {}
    for s in strings:
        offsets[s] = first_str + len(table)
        table += s.encode() + b"\0"
    body = b""
    for name, kind, vlen, size_or_type, trailer, flag in types:
        info = (flag << 31) | (kind << 24) | vlen
        body += struct.pack("<III", offsets.get(name, 0), info, size_or_type) + trailer
    return struct.pack("<HBBIIIII", btf.MAGIC, 1, 0, 24, 0, len(body), len(body), len(table)) + body + table


def members(*entries):
    return b"".join(struct.pack("<III", off, t, bits) for off, t, bits in entries)


def test_split_btf_continues_its_bases_ids_and_strings():
    # base: [1] int, [2] struct base_s {int a; int b;}
    base_strings = ["int", "base_s", "a", "b"]
    base_table_len = 1 + sum(len(s) + 1 for s in base_strings)
    at = dict(zip(base_strings, (1, 5, 12, 14)))
    base = btf.Btf(encode([("int", btf.INT, 0, 4, struct.pack("<I", 32), 0),
                           ("base_s", btf.STRUCT, 2, 8, members((at["a"], 1, 0), (at["b"], 1, 32)), 0)],
                          base_strings), name="base")
    # module: [3] ptr to base_s, [4] typedef myint -> int, [5] int[3],
    # [6] struct mod_s {int x; struct {myint inner; int arr[3];}; base_s *p; base_s s; unsigned f:3;}
    # [7] the anonymous struct
    names = ["myint", "mod_s", "x", "inner", "arr", "p", "s", "f"]
    off = {}
    pos = base_table_len
    for s in names:
        off[s] = pos
        pos += len(s) + 1
    split = encode([
        ("", btf.PTR, 0, 2, b"", 0),
        ("myint", btf.TYPEDEF, 0, 1, b"", 0),
        ("", btf.ARRAY, 0, 0, struct.pack("<III", 1, 1, 3), 0),
        ("mod_s", btf.STRUCT, 5, 48, members((off["x"], 1, 0), (0, 7, 32), (off["p"], 3, 128 | 0),
                                             (off["s"], 2, 192), (off["f"], 1, (3 << 24) | 256)), 1),
        ("", btf.STRUCT, 2, 16, members((off["inner"], 4, 0), (off["arr"], 5, 32)), 0),
    ], names, first_str=base_table_len)
    mod = btf.Btf(split, base=base, name="mod")
    assert mod.member("mod_s", "x") == (0, 4)
    assert mod.member("mod_s", "inner") == (4, 4)        # through the anonymous struct, and the typedef
    assert mod.member("mod_s", "arr") == (8, 12)
    assert mod.member("mod_s", "p") == (16, 8)
    assert mod.member("mod_s", "s.b") == (28, 4)         # a struct of the base, by the base's strings
    assert mod.member("base_s", "b") == (4, 4)           # the base's own structs are found through the module
    with pytest.raises(btf.BtfError, match="bitfield"):
        mod.member("mod_s", "f")


def test_what_is_not_btf_says_so():
    with pytest.raises(btf.BtfError, match="not BTF"):
        btf.Btf(b"\0" * 32, name="junk")


class Reader(KprobeGroup):
    """A kprobe group placed by this kernel's vmlinux BTF (as the nfs and sunrpc groups are by
    their modules')."""
    name = "test"
    source = "owners.c"
    module = "test"
    loses = "what the test group reads"

    def btf(self):
        return vmlinux()


def test_a_member_this_kernel_lacks_is_the_reason_the_group_cannot_run():
    types = vmlinux()

    class Present(Reader):
        members = (("task_struct", "files"), ("list_head", "prev"))
        optional_members = (("linux/sched.h", "task_struct", "no_such",
                             "the test reads something else"),)

    group = Present()
    assert group.missing_members() is None
    off, size = types.member("task_struct", "files")
    flags = group.cflags(None)
    assert f"-DTASK_STRUCT_FILES_OFF={off}" in flags and f"-DTASK_STRUCT_FILES_SIZE={size}" in flags
    assert "-DLIST_HEAD_PREV_OFF=8" in flags and not any("NO_SUCH" in f for f in flags)
    assert group.fallbacks() == ["struct task_struct has no `no_such`: the test reads something else"]
    assert "#include" not in group.program_text()    # no kernel header is compiled

    class Absent(Reader):
        members = (("task_struct", "files"), ("task_struct", "no_such"))

    assert Absent().missing_members() == (
        "struct task_struct has no member `no_such` (task_struct has no `no_such`) in "
        f"{btf.BTF_DIR}/vmlinux; lost: what the test group reads")


def test_without_btf_for_the_module_the_headers_place_the_members():
    class Headers(Reader):   # as 5.10's nfs and sunrpc modules, which have no BTF
        headers = ("linux/sched.h",)
        members = (("task_struct", "files"), ("nfs_pgio_header", "args.context"))

        def btf(self):
            return None

    group = Headers()
    flags = group.cflags(None)
    assert "-DNFS_PGIO_HEADER_ARGS_CONTEXT_OFF=__builtin_offsetof(struct nfs_pgio_header, args.context)" in flags
    assert "-DNFS_PGIO_HEADER_ARGS_CONTEXT_SIZE=sizeof(((struct nfs_pgio_header *)0)->args.context)" in flags
    assert group.program_text().startswith("#include <linux/sched.h>\n")
    assert group.fallbacks()[0].startswith("no BTF for the test module")
