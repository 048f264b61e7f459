"""A write() storm recorded whole: every call a row, nothing lost (issue 24 point 5)."""
import json
import shutil
import subprocess

import pyarrow.compute as pc
import pytest
from livehelp import slotscope

from slotscope.capture.reader import Capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("bpf_ready")]

# Two processes, as fast as the machine's two cores issue them: 1-byte pwrite()s to a traced
# file each (the agent's worst case: every call a row, each ~1 µs under tracing; the agent
# shares the cores with them).
STORM_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    long n = atol(argv[3]);
    pid_t child = fork();
    int fd = open(child ? argv[1] : argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int status = 0;
    if (child < 0 || fd < 0)
        return 1;
    for (long i = 0; i < n; i++)
        if (pwrite(fd, "x", 1, 0) != 1)
            return 2;
    if (!child)
        return 0;
    return waitpid(child, &status, 0) == child && status == 0 ? 0 : 3;
}
"""
CALLS = 1_500_000       # per process


@pytest.mark.timeout(300)
def test_a_write_storm_is_recorded_without_loss(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    (tmp_path / "storm.c").write_text(STORM_C)
    subprocess.run(["gcc", "-O2", "-o", str(tmp_path / "storm"), str(tmp_path / "storm.c")], check=True)
    data, cap = tmp_path / "data", tmp_path / "cap"
    data.mkdir()
    res = slotscope("record", "-o", str(cap), "--path", str(data), "--max-size", "4G", "-q", "--",
                    str(tmp_path / "storm"), str(data / "a"), str(data / "b"), str(CALLS), timeout=240)
    assert res.returncode == 0, res.stderr
    totals = json.loads((cap / "meta.json").read_text())["totals"]
    lost = {name: n for name, n in totals["lost"].items() if n}
    capture = Capture.open(str(cap))
    assert not lost and capture.read("loss") is None, lost
    rows = capture.read("syscall").select(["syscall", "path"])
    writes = rows.filter(pc.equal(rows["syscall"].cast("string"), "pwrite64"))
    assert writes.group_by("path").aggregate([("path", "count")]).sort_by("path").to_pylist() == [
        {"path": str(data / name), "path_count": CALLS} for name in ("a", "b")]
