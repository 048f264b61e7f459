"""watch's log lines: to systemd's journal (JOURNAL_STREAM names stderr) with a priority
prefix and no time, elsewhere with the UTC time."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

SAY = ("from slotscope.agent.watch import journal_stderr, log_line\n"
       "import sys\n"
       "j = journal_stderr()\n"
       "print(log_line('incident x opened: y', j), file=sys.stderr)\n"
       "print(log_line('warning: z', j), file=sys.stderr)\n")


def _run(tmp_path, journal: bool) -> list[str]:
    log = tmp_path / "stderr"
    with open(log, "w") as f:
        st = os.fstat(f.fileno())
        env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
        if journal:
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        subprocess.run([sys.executable, "-c", SAY], stderr=f, env=env, check=True)
    return log.read_text().splitlines()


def test_to_the_journal(tmp_path):
    assert _run(tmp_path, journal=True) == ["<6>incident x opened: y", "<4>warning: z"]


def test_elsewhere_with_the_time(tmp_path):
    lines = _run(tmp_path, journal=False)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ slotscope: .*", line) for line in lines), lines


def test_another_stream_is_not_the_journal(tmp_path):
    """JOURNAL_STREAM inherited from a parent under systemd, stderr redirected since: not the journal."""
    log = tmp_path / "stderr"
    with open(log, "w") as f:
        env = {**os.environ, "JOURNAL_STREAM": "8:12345"}
        subprocess.run([sys.executable, "-c", SAY], stderr=f, env=env, check=True)
    assert not log.read_text().startswith("<")
