"""`slotscope export` of a real capture keeps every row of every table, blocked, owners and xprt
included (export once knew only the reader's own table list, and dropped those three). The frozen
scenario has them all: syscalls blocked through the freeze, the writers' owners, the transport's
slot counters."""
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.vm


def test_export_keeps_every_row_of_every_table(frozen, tmp_path):
    from slotscope.capture.reader import Capture
    cap = Capture.open(str(frozen / "capture"))
    rows = {name: t.num_rows for name in cap.tables() if (t := cap.read(name)) is not None}
    assert {"blocked", "owners", "xprt", "rpc", "syscall"} <= set(rows), rows
    out = tmp_path / "pq"
    res = subprocess.run([sys.executable, "-m", "slotscope.cli", "export", str(frozen / "capture"),
                          "--parquet", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    exported = {name: sum(pq.read_table(p).num_rows for p in (out / name).glob("host=*/*.parquet"))
                for name in rows}
    assert exported == rows
