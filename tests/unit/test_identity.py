"""Who a process is: only whitelisted rank variables, rank precedence, and inheritance of a
rank from the nearest ancestor that has one (checkpoint writers are often children)."""
from __future__ import annotations

import queue

import pytest

from slotscope.agent.identity import RANK_VARS, Identities, Identity, rank_env

pytestmark = pytest.mark.unit


# ---- rank_env: the whitelist ----

def _environ(**env) -> bytes:
    return b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"


def test_rank_env_keeps_only_whitelisted_variables():
    raw = _environ(RANK="3", LOCAL_RANK="1", WORLD_SIZE="8", SECRET="s3cr3t", AWS_SECRET_ACCESS_KEY="wJalr",
                   HF_TOKEN="hf_x", PATH="/usr/bin", HOME="/root", SLURM_PROCID="3", MASTER_ADDR="10.0.0.1")
    env = rank_env(raw)
    assert env == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "SLURM_PROCID": "3"}
    assert "s3cr3t" not in repr(env) and "wJalr" not in repr(env)


def test_rank_env_every_whitelisted_name_and_nothing_like_it():
    raw = b"\0".join([f"{n}=1".encode() for n in RANK_VARS] +
                     [b"RANKS=1", b"XRANK=1", b"rank=1", b"RANK_SECRET=1", b"NOEQUALS", b"=value", b""])
    assert rank_env(raw) == dict.fromkeys(RANK_VARS, "1")


def test_rank_env_values_are_bounded_and_decoded():
    env = rank_env(b"RANK=" + b"7" * 1000 + b"\0TORCHELASTIC_RUN_ID=caf\xe9\0LOCAL_RANK=a=b\0")
    assert env["RANK"] == "7" * 128
    assert env["TORCHELASTIC_RUN_ID"] == "caf\ufffd"
    assert env["LOCAL_RANK"] == "a=b"


def test_rank_env_of_empty_environ():
    assert rank_env(b"") == {}


# ---- Identity: which variable gives the rank ----

def _ident(tgid: int = 10, ppid: int | None = 1, env: dict | None = None, **kw) -> Identity:
    return Identity(tgid, ppid, kw.pop("comm", "python"), kw.pop("cmdline", "python train.py"), "0::/job",
                    dict(env or {}), kw.pop("first_seen", 0), **kw)


@pytest.mark.parametrize("env,rank", [
    ({"RANK": "2", "SLURM_PROCID": "5", "OMPI_COMM_WORLD_RANK": "6", "PMI_RANK": "7", "PMIX_RANK": "8"}, 2),
    ({"SLURM_PROCID": "5", "OMPI_COMM_WORLD_RANK": "6", "PMI_RANK": "7"}, 5),
    ({"OMPI_COMM_WORLD_RANK": "6", "PMI_RANK": "7", "PMIX_RANK": "8"}, 6),
    ({"PMI_RANK": "7", "PMIX_RANK": "8"}, 7),
    ({"PMIX_RANK": "8"}, 8),
    ({"RANK": "not-a-number", "SLURM_PROCID": "4"}, 4),     # an unusable value falls through
    ({"RANK": " 3 "}, 3),
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "4", "NODE_RANK": "0"}, None),   # local rank is not the rank
    ({}, None),
])
def test_rank_precedence(env, rank):
    assert _ident(env=env).rank == rank


def test_local_rank_and_world_size():
    ident = _ident(env={"SLURM_LOCALID": "3", "LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
                        "WORLD_SIZE": "16"})
    assert (ident.local_rank, ident.world_size) == (1, 16)
    assert _ident(env={"SLURM_LOCALID": "3"}).local_rank == 3
    assert _ident(env={}).world_size is None


# ---- Identities: inheritance, with a reader whose results are filled by hand ----

class FakeReader:
    """The IdentityReader interface, without threads or /proc: the test decides what arrives when."""

    def __init__(self):
        self.results: queue.Queue[Identity] = queue.Queue()
        self.requests: list[int] = []
        self.stopped = False

    def request(self, tgid: int, now_ns: int) -> None:
        self.requests.append(tgid)

    def watchdog(self, now_ns: int) -> None:
        pass

    def in_flight(self) -> bool:
        return False

    def stop(self) -> None:
        self.stopped = True

    def arrive(self, tgid: int, ppid: int | None, env: dict | None = None, **kw) -> None:
        ident = _ident(tgid, ppid, env, **kw)
        if env:
            ident.rank_source = "env"
        self.results.put(ident)


@pytest.fixture
def reader():
    return FakeReader()


@pytest.fixture
def ids(reader):
    return Identities(reader)


def _by_tgid(idents) -> dict[int, Identity]:
    return {i.tgid: i for i in idents}


def test_process_with_its_own_variables(ids, reader):
    ids.want(100, 1)
    assert reader.requests == [100]
    assert ids.collect(2) == []                    # nothing read yet
    reader.arrive(100, 1, {"RANK": "3"})
    [ident] = ids.collect(3)
    assert (ident.tgid, ident.rank, ident.rank_source, ident.inherited_from) == (100, 3, "env", None)
    assert ids.collect(4) == []                    # emitted once


def test_child_inherits_its_parents_rank(ids, reader):
    reader.arrive(100, 1, {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    ids.collect(1)
    ids.want(101, 2)
    reader.arrive(101, 100)
    [child] = ids.collect(3)
    assert child.tgid == 101
    assert (child.rank, child.local_rank, child.world_size) == (1, 1, 2)
    assert child.rank_source == "inherited"
    assert child.inherited_from == 100


def test_child_waits_for_a_parent_still_being_read(ids, reader):
    ids.want(101, 1)
    reader.arrive(101, 100)                       # the child's read lands first
    assert ids.collect(2) == [], "emitted before its parent's identity was known"
    assert reader.requests.count(100) == 1        # the parent is asked for, once
    assert ids.collect(3) == []
    assert reader.requests.count(100) == 1
    assert ids.busy()
    reader.arrive(100, 1, {"RANK": "4"})
    [child] = ids.collect(4)
    assert (child.tgid, child.rank, child.rank_source, child.inherited_from) == (101, 4, "inherited", 100)
    assert not ids.busy()
    assert ids.collect(5) == []                   # the parent was not wanted: not emitted


def test_grandchild_inherits_through_a_parent_without_variables(ids, reader):
    reader.arrive(100, 1, {"SLURM_PROCID": "7"})   # the rank's process
    reader.arrive(101, 100)                        # e.g. a shell wrapper, no variables
    ids.collect(1)
    ids.want(102, 2)
    reader.arrive(102, 101)                        # the checkpoint writer
    [gc] = ids.collect(3)
    assert (gc.tgid, gc.rank, gc.rank_source, gc.inherited_from) == (102, 7, "inherited", 100)


def test_whole_family_wanted_at_once(ids, reader):
    for tgid in (100, 101, 102):
        ids.want(tgid, 1)
    reader.arrive(102, 101)
    reader.arrive(101, 100)
    assert ids.collect(2) == []
    reader.arrive(100, 1, {"RANK": "5"})
    got = _by_tgid(ids.collect(3))
    assert sorted(got) == [100, 101, 102]
    assert {t: (i.rank, i.rank_source) for t, i in got.items()} == {
        100: (5, "env"), 101: (5, "inherited"), 102: (5, "inherited")}


def test_own_variables_win_over_the_parents(ids, reader):
    reader.arrive(100, 1, {"RANK": "0"})
    ids.collect(1)
    ids.want(101, 2)
    reader.arrive(101, 100, {"RANK": "9"})
    [child] = ids.collect(3)
    assert (child.rank, child.rank_source, child.inherited_from) == (9, "env", None)


def test_no_ancestor_with_a_rank_settles_without_one(ids, reader):
    ids.want(101, 1)
    reader.arrive(101, 100)
    assert ids.collect(2) == []
    reader.arrive(100, 1)                         # the parent has no variables either; its parent is init
    [child] = ids.collect(3)
    assert (child.rank, child.rank_source, child.inherited_from) == (None, "none", None)


def test_fork_events_give_the_parent_of_a_process_gone_before_its_read(ids, reader):
    """A short-lived writer (fork, no exec) exits before /proc is read: it is its parent's copy."""
    reader.arrive(100, 1, {"RANK": "2"}, comm="python", cmdline="python train.py --save")
    ids.collect(1)
    ids.note_fork(100, 150)
    ids.want(150, 2)
    reader.results.put(Identity(150, None, "", "", "", {}, 2, complete=False))
    [child] = ids.collect(3)
    assert child.ppid == 100
    assert (child.rank, child.rank_source, child.inherited_from) == (2, "inherited", 100)
    assert (child.comm, child.cmdline) == ("python", "python train.py --save")
    assert child.complete is False


def test_exec_reads_the_process_again(ids, reader):
    ids.want(100, 1)
    reader.arrive(100, 1, {"RANK": "0"}, comm="bash")
    [first] = ids.collect(2)
    assert first.comm == "bash"
    ids.exec_(100, 3)
    assert reader.requests == [100, 100]
    # a read requested before the exec that finishes after it is stale: dropped
    reader.arrive(100, 1, {"RANK": "0"}, comm="bash", first_seen=2)
    assert ids.collect(4) == []
    reader.arrive(100, 1, {"RANK": "0"}, comm="python", first_seen=3)
    [again] = ids.collect(4)
    assert again.comm == "python"


def test_a_cycle_in_parent_links_terminates(ids, reader):
    """pid reuse can make stale parent links circular: collect must not loop forever."""
    ids.want(201, 1)
    reader.arrive(201, 202)
    reader.arrive(202, 201)
    [ident] = ids.collect(2)
    assert ident.tgid == 201 and ident.rank is None


# ---- a /proc read that hangs (a process in D state) never stalls the caller ----

def test_hung_read_is_abandoned_and_reported_incomplete(monkeypatch):
    import threading
    import time

    import slotscope.agent.identity as identity

    release = threading.Event()

    def read(tgid, now_ns):
        if tgid == 666:          # stuck, like a read of a D-state process's cmdline
            release.wait(30)
        return Identity(tgid, 1, "ok", "", "", {"RANK": "0"}, now_ns)

    monkeypatch.setattr(identity, "read_identity", read)
    monkeypatch.setattr(identity, "READ_TIMEOUT", 0.2)
    reader = identity.IdentityReader()
    try:
        for tgid in (666, 667, 668):
            reader.request(tgid, 0)
        got, deadline = {}, time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            reader.watchdog(0)
            while not reader.results.empty():
                ident = reader.results.get()
                got[ident.tgid] = ident
        assert set(got) == {666, 667, 668}
        assert got[666].complete is False and got[667].complete and got[668].complete
        assert reader.stuck == 1          # the hung worker was replaced
    finally:
        release.set()
        reader.stop()


def test_a_read_that_finishes_after_the_watchdog_replaces_its_row(ids, reader):
    """A read the watchdog gave up on (a busy machine, not a D state) that then finishes:
    its complete identity is emitted again, so the rank is not lost."""
    ids.want(30, 0)
    reader.results.put(Identity(30, None, "", "", "", {}, 0, complete=False))   # the watchdog's verdict
    first = ids.collect(0)
    assert [(i.tgid, i.rank) for i in first] == [(30, None)]
    reader.results.put(Identity(30, 1, "python", "train.py", "", {"RANK": "5"}, 0))  # the read, late
    again = ids.collect(0)
    assert [(i.tgid, i.rank, i.complete) for i in again] == [(30, 5, True)]


def test_an_exited_process_is_kept_while_a_child_may_inherit_from_it(ids, reader):
    """A launcher that exits before its child first writes still gives the child its rank; once
    both are gone, nothing of either is kept."""
    ids.exec_(100, 1)
    reader.arrive(100, 1, {"RANK": "4"}, first_seen=1)
    ids.note_fork(100, 101)
    ids.exited(100)
    assert ids.collect(2) == [] and 100 in ids.known
    ids.want(101, 3)
    reader.arrive(101, None)                       # gone before /proc was read: its fork names its parent
    [child] = ids.collect(4)
    assert (child.rank, child.inherited_from) == (4, 100)
    ids.exited(101)
    assert ids.collect(5) == []
    assert (ids.known, ids.parent, ids.busy()) == ({}, {}, False)


def test_an_exited_process_is_kept_until_its_row_is_written(ids, reader):
    """Its identity was read, but its row waits for an ancestor's read (the rank it inherits)."""
    ids.want(100, 1)
    ids.exited(100)
    reader.arrive(100, 50)
    assert ids.collect(2) == [] and 100 in ids.known
    reader.arrive(50, 1, {"RANK": "7"})
    [ident] = ids.collect(3)
    assert (ident.tgid, ident.rank, ident.inherited_from) == (100, 7, 50)
    assert 100 not in ids.known
