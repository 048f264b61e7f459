"""Which files are recorded (FileFilter, RecordOptions), which mount a path is on
(mountinfo), and which file an fd held at a given time (FdTable)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from slotscope.agent.files import UNKNOWN, FdTable, FileFilter, traced_devs
from slotscope.agent.layouts import PATH_MAX_CAPTURED
from slotscope.agent.mounts import MountTable, parse_mountinfo
from slotscope.agent.probes import PATH_PREFIXES_MAX, path_filter_flags
from slotscope.agent.recorder import RecordOptions

pytestmark = pytest.mark.unit


# ---- FileFilter and the record options that make it ----

def test_default_is_nfs_only():
    f = RecordOptions(output="x").file_filter()
    assert f.prefixes == ()
    assert f.matches("/mnt/ckpt/a", "nfs")
    assert f.matches("/mnt/ckpt/a", "nfs4")
    assert not f.matches("/home/u/a", "ext4")
    assert not f.matches("/tmp/a", "tmpfs")
    assert not f.matches("/somewhere", None)      # unknown filesystem: not NFS


def test_path_implies_any_filesystem():
    f = RecordOptions(output="x", paths=["/data/ckpt"]).file_filter()
    assert f.fstypes is None
    assert f.matches("/data/ckpt/step100/shard0", "ext4")
    assert f.matches("/data/ckpt/step100/shard0", "nfs4")
    assert not f.matches("/data/other/shard0", "ext4")


def test_fs_any():
    f = RecordOptions(output="x", fs="any").file_filter()
    assert f.fstypes is None and f.prefixes == ()
    for fstype in ("ext4", "xfs", "tmpfs", "nfs4", None):
        assert f.matches("/any/where", fstype)


def test_fs_named_type_with_path():
    f = RecordOptions(output="x", paths=["/data"], fs="xfs").file_filter()
    assert f.matches("/data/a", "xfs")
    assert not f.matches("/data/a", "ext4")
    assert not f.matches("/other/a", "xfs")


def test_fs_nfs_with_path_narrows_to_nfs():
    f = RecordOptions(output="x", paths=["/mnt"], fs="nfs").file_filter()
    assert f.matches("/mnt/a", "nfs")
    assert f.matches("/mnt/a", "nfs4")
    assert not f.matches("/mnt/a", "ext4")


def test_prefix_matches_by_path_component():
    f = FileFilter(("/mnt/ck",), None)
    assert f.matches("/mnt/ck", "ext4")
    assert f.matches("/mnt/ck/a", "ext4")
    assert f.matches("/mnt/ck/sub/dir/a", "ext4")
    assert not f.matches("/mnt/ckpt2/a", "ext4")
    assert not f.matches("/mnt/ck2", "ext4")
    assert not f.matches("/mnt", "ext4")


def test_record_options_normalise_prefixes(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    f = RecordOptions(output="x", paths=["/mnt/ck/", "rel/dir", "/a//b/../c"]).file_filter()
    assert f.prefixes == ("/mnt/ck", os.path.join(str(tmp_path), "rel", "dir"), "/a/c")
    assert f.matches("/mnt/ck/x", "ext4")
    assert not f.matches("/mnt/ckx", "ext4")
    assert f.matches(str(tmp_path / "rel" / "dir" / "f"), "ext4")


def test_root_prefix_matches_everything():
    f = RecordOptions(output="x", paths=["/"]).file_filter()
    assert f.matches("/anything/at/all", "ext4")


def test_several_prefixes():
    f = FileFilter(("/a", "/b/c"), None)
    assert f.matches("/a/x", None) and f.matches("/b/c/x", None)
    assert not f.matches("/b/x", None)


# ---- mountinfo ----

MOUNTINFO = "\n".join([
    r"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro",
    r"30 22 0:25 / /mnt rw,nosuid shared:5 - tmpfs tmpfs rw,size=1024k",
    r"41 30 0:52 / /mnt/ck rw,relatime shared:30 master:2 - nfs4 srv:/export/ck rw,vers=4.2,rsize=1048576,"
    r"wsize=1048576,hard,proto=tcp,nconnect=4,timeo=600,retrans=2,addr=10.0.0.5",
    r"42 30 0:53 /sub\040dir /mnt/my\040ckpt\011tab rw - nfs srv:/export\134back rw,vers=3,addr=10.0.0.6",
    r"43 22 0:54 / /mnt/ck/inner rw - xfs /dev/sdb rw",
    "garbage line without the separator",
    "",
])


def test_parse_mountinfo_fields_and_escapes():
    mounts = {m.mount_id: m for m in parse_mountinfo(MOUNTINFO)}
    assert sorted(mounts) == [22, 30, 41, 42, 43]
    nfs = mounts[41]
    assert (nfs.mountpoint, nfs.fstype, nfs.source) == ("/mnt/ck", "nfs4", "srv:/export/ck")
    assert nfs.dev == os.makedev(0, 52)
    assert nfs.is_nfs
    assert nfs.option("vers") == "4.2"
    assert nfs.option("nconnect") == "4"
    assert nfs.option("hard") == ""
    assert nfs.option("relatime") == ""      # per-mount options are there too
    assert nfs.option("soft") is None
    esc = mounts[42]
    assert esc.mountpoint == "/mnt/my ckpt\ttab"
    assert esc.root == "/sub dir"
    assert esc.source == "srv:/export\\back"
    assert esc.is_nfs and esc.option("vers") == "3"
    assert mounts[22].dev == os.makedev(8, 1) and not mounts[22].is_nfs


def test_find_takes_the_longest_mount_point_prefix():
    table = MountTable(parse_mountinfo(MOUNTINFO))
    assert table.find("/mnt/ck/step1/shard").mount_id == 41
    assert table.find("/mnt/ck").mount_id == 41
    assert table.find("/mnt/ck/inner/x").mount_id == 43
    assert table.find("/mnt/ckpt2/x").mount_id == 30       # by component: /mnt, not /mnt/ck
    assert table.find("/mnt/my ckpt\ttab/f").mount_id == 42
    assert table.find("/home/u").mount_id == 22
    assert table.find("/").mount_id == 22
    assert {m.mount_id for m in table.nfs_mounts()} == {41, 42}


def test_later_mount_shadows_an_earlier_one_at_the_same_point():
    text = MOUNTINFO + "\n" + r"50 30 0:60 / /mnt/ck rw - ext4 /dev/sdc rw"
    table = MountTable(parse_mountinfo(text))
    assert table.find("/mnt/ck/a").fstype == "ext4"
    assert table.by_id[41].fstype == "nfs4"


def test_find_without_a_root_mount_is_none():
    table = MountTable(parse_mountinfo(r"41 30 0:52 / /mnt/ck rw - nfs4 srv:/x rw"))
    assert table.find("/home/u") is None
    assert table.find("/mnt/ck/a").mount_id == 41


# ---- FdTable: which file an fd held at time t ----

A, B, C = 11, 12, 13                 # file ids
T1, T2, T3 = 1_000, 2_000, 3_000     # open A, close, reopen the same fd number on B


def _table() -> FdTable:
    fds = FdTable()
    key = FdTable.key(100, 5)
    fds.set(key, T1, A)
    fds.set(key, T2, UNKNOWN)
    fds.set(key, T3, B)
    return fds


def test_at_resolves_by_time():
    fds = _table()
    key = FdTable.key(100, 5)
    assert fds.at(key, T1 - 1) is None
    assert fds.at(key, T1) == (T1, A)
    assert fds.at(key, (T1 + T2) // 2) == (T1, A)
    assert fds.at(key, T2 + 1) == (T2, UNKNOWN)
    assert fds.at(key, T3 + 5) == (T3, B)
    assert fds.at(FdTable.key(100, 6), T3) is None
    assert fds.at(FdTable.key(101, 5), T3) is None     # another process's fd 5


def test_lookup_resolves_many_writes_at_once():
    fds = _table()
    k5, k7 = FdTable.key(100, 5), FdTable.key(100, 7)
    times = np.array([1_500, 2_500, 3_500, 500, 1_999, 3_000, 1_700], np.int64)
    keys = np.array([k5, k5, k5, k5, k5, k5, k7], np.int64)
    resolved = []

    def resolve(key):
        resolved.append(key)
        return C

    found, since = fds.lookup(keys, times, resolve)
    assert found.tolist() == [A, UNKNOWN, B, UNKNOWN, A, B, C]
    assert since.tolist() == [T1, T2, T3, 0, T1, T3, 0]
    assert resolved == [k7], "an fd from before recording is named once, from /proc"
    # now known: not resolved again
    fds.lookup(np.array([k7, k7], np.int64), np.array([1, 2], np.int64), resolve)
    assert resolved == [k7]


def test_lookup_with_a_single_mapping_and_many_processes():
    fds = FdTable()
    fds.set(FdTable.key(1, 3), T1, A)
    fds.set(FdTable.key(2, 3), T1, B)
    keys = np.array([FdTable.key(2, 3), FdTable.key(1, 3), FdTable.key(2, 3)], np.int64)
    found, _ = fds.lookup(keys, np.array([T2, T2, T3], np.int64), lambda k: UNKNOWN)
    assert found.tolist() == [B, A, B]


def test_fork_copies_the_parents_open_fds():
    fds = FdTable()
    fds.set(FdTable.key(100, 3), T1, A)
    fds.set(FdTable.key(100, 4), T1, B)
    fds.set(FdTable.key(100, 4), T2, UNKNOWN)     # fd 4 was closed before the fork
    fds.set(FdTable.key(100, 6), T1, C)
    fds.set(FdTable.key(100, 6), T2, A)           # fd 6 re-opened on A
    fds.fork(100, 200, T3)
    assert fds.at(FdTable.key(200, 3), T3 + 1) == (T3, A)
    assert fds.at(FdTable.key(200, 6), T3 + 1) == (T3, A)
    assert fds.at(FdTable.key(200, 4), T3 + 1) is None
    # the parent keeps its own
    assert fds.at(FdTable.key(100, 3), T3 + 1) == (T1, A)
    # the child's later open of fd 3 does not touch the parent's fd 3
    fds.set(FdTable.key(200, 3), T3 + 10, B)
    assert fds.at(FdTable.key(100, 3), T3 + 20) == (T1, A)
    assert fds.at(FdTable.key(200, 3), T3 + 20) == (T3 + 10, B)


def test_drop_process_forgets_only_that_process():
    fds = FdTable()
    fds.set(FdTable.key(100, 3), T1, A)
    fds.set(FdTable.key(101, 3), T1, B)
    fds.drop_process(100)
    assert fds.at(FdTable.key(100, 3), T2) is None
    assert fds.at(FdTable.key(101, 3), T2) == (T1, B)
    fds.fork(100, 300, T3)                      # a dropped parent has nothing to copy
    assert fds.at(FdTable.key(300, 3), T3) is None


def test_negative_fd_keys_do_not_collide_with_other_processes():
    assert FdTable.key(100, -100) != FdTable.key(101, -100)
    assert FdTable.key(100, -100) >> 32 == 100


@pytest.mark.parametrize("mappings", [[(T1, A)], [(T1, A), (T3, B)]], ids=["one-mapping", "two-mappings"])
def test_lookup_agrees_with_at(mappings):
    """The bulk lookup and the one-by-one at() name the same file for every time, also for a
    write that started before the only mapping we know of (e.g. a dup2 onto an fd whose earlier
    file we never saw, decoded in the same batch): that write's file is unknown, not the new one."""
    fds = FdTable()
    key = FdTable.key(100, 5)
    for since, fid in mappings:
        fds.set(key, since, fid)
    times = np.array([T1 - 500, T1 - 1, T1, T1 + 1, T2, T3, T3 + 1], np.int64)
    found, since = fds.lookup(np.full(times.shape, key, np.int64), times, lambda k: C)
    want = [fds.at(key, int(t)) or (0, UNKNOWN) for t in times]
    assert list(zip(since.tolist(), found.tolist())) == want


def test_lookup_of_a_storm_batch_agrees_with_at():
    """A storm's batch: long runs of one fd whose number named other files before (its newest
    mapping older than the batch: one mapping for all its rows), among a few rows of an fd
    reopened inside the batch (searched row by row)."""
    fds = FdTable()
    storm, other = FdTable.key(100, 5), FdTable.key(200, 3)
    for since, fid in ((T1, A), (T2, UNKNOWN), (T3, B)):
        fds.set(storm, since, fid)
    fds.set(other, T1, A)
    fds.set(other, T3 + 500, C)
    times = np.arange(T3 + 100, T3 + 1_100, 10, dtype=np.int64)
    keys = np.full(times.shape, storm, np.int64)
    keys[[30, 31, 70]] = other                        # before and after its reopen
    found, since = fds.lookup(keys, times, lambda k: UNKNOWN)
    want = [fds.at(int(k), int(t)) or (0, UNKNOWN) for k, t in zip(keys, times)]
    assert list(zip(since.tolist(), found.tolist())) == want
    assert found[[30, 70]].tolist() == [A, C] and set(found[keys == storm].tolist()) == {B}


def test_close_range_closes_only_its_range():
    fds = FdTable()
    for fd, fid in ((3, A), (4, B), (9, C)):
        fds.set(FdTable.key(100, fd), T1, fid)
    fds.close_fds(100, T2, 4, 8)                  # close_range(4, 8)
    assert fds.at(FdTable.key(100, 3), T3) == (T1, A)
    assert fds.at(FdTable.key(100, 4), T3) == (T2, UNKNOWN)
    assert fds.at(FdTable.key(100, 4), T2 - 1) == (T1, B)   # writes before the close still name B
    assert fds.at(FdTable.key(100, 9), T3) == (T1, C)


def test_exec_closes_cloexec_fds_and_fork_keeps_the_flag():
    fds = FdTable()
    fds.set(FdTable.key(100, 3), T1, A)
    fds.set(FdTable.key(100, 4), T1, B, cloexec=True)
    fds.set(FdTable.key(100, 5), T1, C)
    fds.close_fds(100, T1 + 1, 5, 5, mark_cloexec=True)      # close_range(5, 5, CLOSE_RANGE_CLOEXEC)
    assert fds.at(FdTable.key(100, 5), T1 + 2) == (T1, C)    # marked, still open
    fds.fork(100, 200, T2)
    fds.close_fds(200, T3, only_cloexec=True)                # the child execs
    assert fds.at(FdTable.key(200, 3), T3 + 1) == (T2, A)
    assert fds.at(FdTable.key(200, 4), T3 + 1) == (T3, UNKNOWN)
    assert fds.at(FdTable.key(200, 5), T3 + 1) == (T3, UNKNOWN)
    assert fds.at(FdTable.key(100, 4), T3 + 1) == (T1, B)    # the parent did not exec
    # a plain re-open of a cloexec fd number is not cloexec any more
    fds.set(FdTable.key(100, 4), T3, A)
    fds.close_fds(100, T3 + 5, only_cloexec=True)
    assert fds.at(FdTable.key(100, 4), T3 + 6) == (T3, A)


# ---- the devices whose stats the kernel keeps (bpf/syscalls.c FILTER_DEVS) ----

DEVS_MOUNTINFO = """\
22 1 254:0 / / rw - ext4 /dev/vda rw
30 22 0:40 / /tmp rw - tmpfs tmpfs rw
31 30 0:41 / /tmp/job/ckpt rw - tmpfs ckpt rw
40 22 0:53 / /mnt/nfs rw - nfs 10.0.0.1:/export rw,vers=3
41 22 0:54 / /mnt/other rw - nfs4 10.0.0.2:/ rw,vers=4.2
"""


def test_traced_devices_follow_the_filter():
    table = MountTable(parse_mountinfo(DEVS_MOUNTINFO))
    devs = lambda prefixes, fstypes: traced_devs(FileFilter(prefixes, fstypes), [table])  # noqa: E731
    assert devs((), frozenset({"nfs", "nfs4"})) == {os.makedev(0, 53), os.makedev(0, 54)}
    # a prefix keeps the mounts at, above and below it: any of them may hold its files
    assert devs(("/tmp/job",), None) == {os.makedev(254, 0), os.makedev(0, 40), os.makedev(0, 41)}
    assert devs(("/tmp/job",), frozenset({"tmpfs"})) == {os.makedev(0, 40), os.makedev(0, 41)}
    assert devs(("/mnt/nfs/run1",), frozenset({"nfs", "nfs4"})) == {os.makedev(0, 53)}
    assert devs((), None) is None       # --fs any: every device may hold a traced file


@pytest.mark.timeout(10)   # the bug was an endless loop
def test_find_ends_on_paths_that_are_not_normalised():
    """normpath keeps a leading "//" (pyenv opens "//.python-version"): the walk up from it
    reached "//" and stayed there, and the agent's drain never returned."""
    table = MountTable(parse_mountinfo(MOUNTINFO))
    assert table.find("//.python-version") is None
    assert table.find("relative/x") is None


def _related(flags: list[str], path: str) -> bool:
    """PATH_RELATED(s) of bpf/syscalls.c, evaluated on the path's bytes as the kernel's buffer holds them."""
    [macro] = [f for f in flags if f.startswith("-DPATH_RELATED(s)=")]
    s = path.encode() + bytes(PATH_MAX_CAPTURED)
    return eval(macro.partition("=")[2].replace("&&", " and ").replace("||", " or "), {"s": s})


@pytest.mark.parametrize("prefixes", [("/mnt/ckpt",), ("/mnt/ckpt", "/var/tmp/rün x"), ("/a",)])
def test_the_kernel_path_filter_keeps_what_user_space_would(prefixes):
    """The kernel drops a normal absolute path only where the filter would refuse it and it is
    not a directory above a prefix (an openat may start there)."""
    flags = path_filter_flags(prefixes)
    assert "-DFILTER_PATHS" in flags
    paths = ["/", "/mnt", "/mnt/ckpt", "/mnt/ckpt/x.pt", "/mnt/ckpt/a/b", "/mnt/ckptx", "/mnt/ck", "/mn",
             "/var", "/var/tmp", "/var/tmp/rün x", "/var/tmp/rün x/y", "/var/tmp/rün", "/var/tmp/rün xy",
             "/a", "/ab", "/a/b", "/usr/lib/python3/os.py", "/b/a"]
    for path in paths[1:]:      # "/" is never dropped: not normal for the kernel's check (a trailing "/")
        above = any(p.startswith(path + "/") for p in prefixes)
        assert _related(flags, path) == (FileFilter(prefixes, None).matches(path, None) or above), path


def test_no_kernel_path_filter_where_user_space_must_decide():
    assert path_filter_flags(()) == [] and path_filter_flags(("/",)) == []
    assert path_filter_flags(tuple(f"/p{i}" for i in range(PATH_PREFIXES_MAX + 1))) == []
    assert path_filter_flags(("/" + "x" * PATH_MAX_CAPTURED,)) == []
