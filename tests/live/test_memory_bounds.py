"""What the agent keeps in memory. Per fd and per process, it is let go with the process: a
process that opens an untraced file 20,000 times, or runs 1,000 short-lived children, leaves
nothing behind in the decoder once it exited (Python memory traced by tracemalloc, not RSS:
what the code keeps, not what the allocator holds on to). Of the compiler, once the probes
are loaded, only the pages its libraries wrote stay resident."""
import gc
import time
import tracemalloc

import pytest

from slotscope.agent.decode import Decoder
from slotscope.agent.files import FileFilter, FileRegistry
from slotscope.agent.identity import Identities
from slotscope.agent.memory import COMPILER, file_copies, mappings
from slotscope.agent.probes import PAGE
from livehelp import ask, python_child, syscall_probes_on

pytestmark = pytest.mark.live

# "open DIR N": open, write and close DIR/f N times; "spawn N": run N /bin/true one after another.
CHILD = r"""
import os, subprocess, sys
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "open":
        for _ in range(int(args[1])):
            fd = os.open(os.path.join(args[0], "f"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, b"x")
            os.close(fd)
    elif cmd == "spawn":
        for _ in range(int(args[0])):
            subprocess.run(["/bin/true"], check=True)
    print("done", flush=True)
"""
AGENT_FILES = ("*/agent/decode.py", "*/agent/files.py", "*/agent/identity.py")


def kept() -> int:
    """Bytes the decoder's modules allocated and still hold (a full collection empties the
    interpreter's free lists first: up to 2,000 freed tuples of each size wait there)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f) for f in AGENT_FILES])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def drain(loaded, decoder: Decoder) -> None:
    """One drain as the recorder makes it: a batch decoded, the identities collected."""
    batch = loaded.read_batch()
    decoder.feed(batch["sys_ring"], batch["path_ring"], batch["proc_ring"], batch.get("env_ring"),
                 caught_up=loaded.syscalls_caught_up)
    decoder.identities.collect(time.clock_gettime_ns(time.CLOCK_MONOTONIC))


def settle(loaded, decoder: Decoder) -> None:
    """Drain until two batches in a row caught up: an exit read in the first is applied in the second."""
    caught_up = 0
    while caught_up < 2:
        drain(loaded, decoder)
        caught_up = caught_up + 1 if loaded.syscalls_caught_up else 0


def kept_after(tmp_path, commands: list[str]) -> int:
    """Bytes the decoder keeps after a traced process ran `commands` (drained after each, as
    the agent drains every second: the path ring holds ~15,000 paths) and exited, beyond what
    it kept before."""
    traced = tmp_path / "traced"
    traced.mkdir()
    with python_child(CHILD) as child, syscall_probes_on(child.pid) as loaded:
        decoder = Decoder(FileRegistry(FileFilter(prefixes=(str(traced),), fstypes=None)), Identities(),
                          loaded.ignore_fd)
        tracemalloc.start()
        try:
            assert ask(child, f"open {tmp_path} 10") == "done"
            drain(loaded, decoder)
            before = kept()
            for command in commands:
                assert ask(child, command) == "done"
                drain(loaded, decoder)
            child.stdin.close()
            child.wait(10)
            settle(loaded, decoder)
            end = time.monotonic() + 30     # the identity reads of its children finish (the watchdog bounds each)
            while decoder.identities.busy() and time.monotonic() < end:
                time.sleep(0.05)
                drain(loaded, decoder)
            assert not decoder.identities.busy()
            assert loaded.loss_totals() == dict.fromkeys(loaded.loss_totals(), 0)   # every event decoded
            return kept() - before
        finally:
            tracemalloc.stop()


# Emptied dicts keep the tables of their peak size (tens of KiB); one record per open or per
# child may not stay.
def test_the_opens_of_an_untraced_file_leave_nothing_behind(tmp_path):
    more = kept_after(tmp_path, [f"open {tmp_path} 2000"] * 10)     # 4.6 MB were kept, ~230 bytes an open
    assert more < 256 * 1024, f"kept {more} bytes more after the process exited"


def test_short_lived_children_leave_nothing_behind(tmp_path):
    more = kept_after(tmp_path, ["spawn 100"] * 10)                 # 520 KB were kept, ~520 bytes a child
    assert more < 128 * 1024, f"kept {more} bytes more after the process exited"


def test_the_compiler_pages_are_given_back_once_the_probes_are_loaded():
    with python_child(CHILD) as child, syscall_probes_on(child.pid):
        resident = sum(m.kb["Rss"] * 1024 for m in file_copies() if COMPILER.search(m.path))
    assert resident < 1024 * 1024, f"{resident / 2**20:.1f} MiB of libbcc, LLVM and clang still resident"   # 75 MiB were


def test_the_rings_count_once_in_the_resident_set():
    """The reader maps each ring's data pages once (agent/ringbuf.py): twice, they were 42.5
    MiB of RSS for 21 MiB of rings."""
    with python_child(CHILD) as child, syscall_probes_on(child.pid) as loaded:
        resident = sum(m.kb["Rss"] * 1024 for m in mappings() if m.path.startswith("anon_inode:bpf-map"))
        rings = sum(ring.data_size + 2 * PAGE for ring in loaded.rings.values())   # + consumer, producer pages
    assert resident <= rings, f"{resident / 2**20:.1f} MiB resident for {rings / 2**20:.1f} MiB of rings"
