"""--path on this kernel: the calls plainly outside the prefixes are dropped in the kernel
(bpf/syscalls.c unrelated_path), the fds they open skipped; every traced file is still
recorded, reached by a non-normal absolute path, from a directory fd or from the cwd."""
import json
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from livehelp import slotscope
from slotscope.capture.reader import Capture

pytestmark = pytest.mark.live

UNTRACED = 3000

JOB = """
import os, sys
base = sys.argv[1]
for i in range({n}):
    fd = os.open(f"{{base}}/other/f{{i % 50}}", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"x" * 100)
    os.close(fd)
    os.stat(f"{{base}}/other/f{{i % 50}}")
for p in (f"{{base}}/traced/a", f"{{base}}/./traced/b", f"{{base}}//traced/c", f"{{base}}/other/../traced/f"):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600); os.write(fd, b"y" * 4096); os.close(fd)
dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)      # above the prefix: kept, for the openat below
fd = os.open("traced/d", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=dfd); os.write(fd, b"z" * 4096)
os.close(fd)
os.chdir(f"{{base}}/other")                              # outside the prefix: a chdir is never dropped
fd = os.open("../traced/e", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600); os.write(fd, b"w" * 4096); os.close(fd)
# A tree outside the prefix made and removed by names relative to its directory's fd (rmtree's
# way): dropped in the kernel, the subdirectory opened so too.
top = os.open(f"{{base}}/other", os.O_RDONLY | os.O_DIRECTORY)
os.mkdir("sub", dir_fd=top)
sub = os.open("sub", os.O_RDONLY | os.O_DIRECTORY, dir_fd=top)
for i in range({n} // 3):
    fd = os.open(f"g{{i}}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=sub); os.close(fd)
    os.stat(f"g{{i}}", dir_fd=sub)
    os.unlink(f"g{{i}}", dir_fd=sub)
""".format(n=UNTRACED)


def _record(tmp_path, job: str):
    """`record --path TMP/traced -- python -c JOB TMP`: -> the capture's directory."""
    (tmp_path / "traced").mkdir()
    (tmp_path / "other").mkdir()
    cap = tmp_path / "cap"
    res = slotscope("record", "-q", "--path", str(tmp_path / "traced"), "-o", str(cap), "--",
                    sys.executable, "-c", job, str(tmp_path))
    assert res.returncode == 0, res.stderr
    return cap


def test_calls_outside_the_prefix_stay_in_the_kernel(tmp_path):
    cap = _record(tmp_path, JOB)
    capture = Capture.open(str(cap))
    rows = capture.read("syscall")
    writes = rows.filter(pc.equal(pc.cast(rows["syscall"], pa.string()), "write"))
    assert sorted(zip(writes["path"].to_pylist(), writes["bytes"].to_pylist())) == \
        [(str(tmp_path / "traced" / name), 4096) for name in "abcdef"]
    totals = json.loads((cap / "meta.json").read_text())["totals"]
    # 4 untraced calls a round (open, write, close, stat) and two paths, 3 (open, close,
    # stat, unlink; one path each) in the tree's: 22,000 events in user space without the
    # filter; what is left is the interpreter's start-up and the traced files'
    assert totals["events"] < UNTRACED, totals
    assert sum(totals["lost"].values()) == 0


REUSED = """
import os, sys, time
base = sys.argv[1]
dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)   # above the prefix: user space sees it, ignores its fd
os.close(dfd)
fd = os.open(f"{base}/other/g", os.O_WRONLY | os.O_CREAT, 0o600)   # the same fd, dropped in the kernel
assert fd == dfd
time.sleep(2.5)                 # the agent's drains mark the directory's fd, a generation it has left
for i in range({n}):
    os.write(fd, b"x")
""".replace("{n}", str(UNTRACED))


def test_a_mark_for_an_fd_s_earlier_file_does_not_undo_the_kernel_s(tmp_path):
    """User space marks an untraced fd with the generation it saw opened; when the kernel has
    since skipped the fd's next file (opened outside the prefix), that mark must not replace
    the kernel's: every write to the new file would come up, unnamed."""
    totals = json.loads((_record(tmp_path, REUSED) / "meta.json").read_text())["totals"]
    assert totals["unnamed_fd_rows"] < UNTRACED // 10, totals
