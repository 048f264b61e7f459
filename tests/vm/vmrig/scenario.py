"""Host side of `run-scenario`: parse options, hand the job to a VM, collect results.

The guest half is tests/vm/guest/scenario.py; the two talk through spec.json (in) and
the out/ directory (back) of the 9p job share.
"""

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import mountstats
from .image import KERNELS, REPO, VM_DIR, BuildError, ensure_image
from .vm import GUEST_METRICS, Share, VMError, metrics_nic, run_vm, stream_nic

sys.path.insert(0, str(REPO / "tests"))
import prom  # noqa: E402  (tests/prom.py: the Prometheus server the VM tests query too)

MODES = ("buffered", "fsync", "osync", "odirect")
CLIENTS = ("torch-save", "dcp", "dcp-async", "safetensors")     # tests/vm/guest/clients.py
# after-s: the rank starts this many seconds after the ranks without it have ended (with --watch,
# and watch has no incident open): a second save after a quiet gap
OVERRIDE_KEYS = {"write-size": ("write_size", int), "mode": ("mode", str), "file-mb": ("file_mb", float),
                 "after-s": ("after_s", float)}


# The packages `slotscope record` runs in the guest (bpf/ is hashed with its C sources).
GUEST_PACKAGES = ("cli", "agent", "capture", "bpf")


class ScenarioFailed(RuntimeError):
    pass


def rank_override(text):
    """RANK:key=value,... -> (rank, {field: value})."""
    try:
        rank, _, rest = text.partition(":")
        fields = {}
        for item in rest.split(","):
            key, value = item.split("=", 1)
            name, conv = OVERRIDE_KEYS[key]
            fields[name] = conv(value)
        if fields.get("mode", MODES[0]) not in MODES:
            raise ValueError
        return int(rank), fields
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"bad --rank-override {text!r}: want RANK:write-size=BYTES,mode=MODE[,file-mb=MB][,after-s=S]") from None


def node_rate(text):
    """NODE:MBIT -> (node, mbit)."""
    try:
        node, _, mbit = text.partition(":")
        return int(node), float(mbit)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --node-rate-mbit {text!r}: want NODE:MBIT, e.g. 2:20") from None


def parser():
    ap = argparse.ArgumentParser(
        prog="run-scenario",
        description="Run one NFS checkpoint-storm scenario in the qemu VM and collect its results.")
    ap.add_argument("--out", required=True, type=Path, help="results directory (created)")
    ap.add_argument("--kernel", choices=tuple(KERNELS), default="6.1")
    ap.add_argument("--nfs-vers", choices=("3", "4.1", "4.2"), default="4.2")
    ap.add_argument("--nconnect", type=int, help="mount option nconnect (1-16)")
    ap.add_argument("--wsize", type=int, help="mount option wsize in bytes")
    ap.add_argument("--timeo", type=int, help="mount option timeo in tenths of a second (with --retrans: how "
                                              "soon 'server not responding' is logged)")
    ap.add_argument("--retrans", type=int, help="mount option retrans")
    ap.add_argument("--dirty-background-bytes", type=int,
                    help="vm.dirty_background_bytes in the VM: small values make the flusher (a kworker) "
                         "write buffered data back while the ranks still write")
    ap.add_argument("--slots", type=int, help="slot limit: sunrpc TCP slot table for NFSv3, "
                    "nfs.max_session_slots for NFSv4.1+ (default: kernel defaults)")
    ap.add_argument("--delay-ms", type=float, default=0, help="netem delay added in EACH direction")
    ap.add_argument("--rate-mbit", type=float, help="tbf rate limit in each direction")
    ap.add_argument("--loss-pct", type=float, default=0, help="netem loss in each direction")
    ap.add_argument("--ranks", type=int, default=4, help="the job's ranks (WORLD_SIZE), over all its nodes")
    ap.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                    help="2: a second client VM (node 2) against node 1's server, joined by qemu's stream "
                         "networking over a unix socket; the ranks split in order between the nodes, each node "
                         "with its own agent and capture (node 2's results in OUT/node2); with --client one "
                         "torchrun job over both nodes")
    ap.add_argument("--node-rate-mbit", type=node_rate, action="append", default=[], metavar="NODE:MBIT",
                    help="tbf rate limit of one node's link, each direction (repeatable): a straggler node")
    ap.add_argument("--write-size", type=int, default=1 << 20, help="bytes per write()")
    ap.add_argument("--mode", choices=MODES, default="buffered")
    ap.add_argument("--file-mb", type=float, default=8, help="size of each file a rank writes")
    ap.add_argument("--files-per-rank", type=int, default=1)
    ap.add_argument("--rank-override", type=rank_override, action="append", default=[],
                    metavar="RANK:write-size=BYTES,mode=MODE", help="per-rank settings (repeatable)")
    ap.add_argument("--client", choices=CLIENTS, action="append", default=[],
                    help="a real checkpointing job instead of the rig's writers: --ranks ranks under torchrun "
                         "(gloo), each saving a state dict of --state-mb with this library (guest/clients.py); "
                         "repeatable: the one job saves with each in turn")
    ap.add_argument("--state-mb", type=float, default=8, help="with --client: each rank's state dict")
    ap.add_argument("--saves", type=int, default=1, help="with --client: saves, into step_<n>/ each")
    ap.add_argument("--save-every", type=float, default=2, metavar="S",
                    help="with --client: seconds of computing between two saves")
    ap.add_argument("--server-freeze-at", type=float, metavar="S",
                    help="seconds after the writers start to make the server unreachable")
    ap.add_argument("--server-freeze-for", type=float, metavar="S", help="how long it stays unreachable")
    ap.add_argument("--agent-args", default="", help="extra arguments for `slotscope record` (with --watch, "
                                                     "`slotscope watch`)")
    ap.add_argument("--watch", action="store_true",
                    help="the agent is `slotscope watch --out INCIDENTS --fs nfs --metrics ADDR:PORT` (a boot of its "
                         "own): its incidents are copied to OUT/incidents, and its metrics, served through a "
                         "user-mode NIC restricted to one port forwarded from the host's 127.0.0.1, are scraped "
                         "every second for the boot's life by Prometheus on the host (TSDB in OUT/prometheus); "
                         "with --compare-agent, served on the client namespace's loopback and scraped from "
                         "inside the guest every 15 s, as a fleet's Prometheus would (no NIC, no Prometheus)")
    ap.add_argument("--no-agent", action="store_true", help="run without the agent")
    ap.add_argument("--agent-profile", action="store_true",
                    help="run the agent under Python's cProfile: each start writes OUT/<scenario>/agent-<n>.prof "
                         "(bench/overhead.py --agent-profile; it slows the agent's own code)")
    ap.add_argument("--agent-user", metavar="USER",
                    help="run the agent and the ranks as this ordinary user (created in the guest, uid 1000, "
                         "owning the export's checkpoint directory): what a user without root meets")
    ap.add_argument("--compare-agent", type=int, metavar="N",
                    help="overhead mode: after a warm-up round, N blocks of rounds of the writers, "
                         "each block without then with the agent (--compare-repeat rounds each), and a "
                         "last block without; every round into its own directory; scenario.json's `rounds` has each round's "
                         "bytes/s and CPU use (bench/overhead.py)")
    ap.add_argument("--compare-repeat", type=int, default=1, metavar="M",
                    help="with --compare-agent: M rounds in a row each time (one agent start per M rounds)")
    ap.add_argument("--ftrace", action="append", default=[], metavar="SYSTEM:EVENT",
                    help="also enable this kernel trace event during the writers; the ftrace buffer "
                         "is saved as ftrace.txt (repeatable; e.g. nfs4:nfs4_sequence_done, whose slot_nr covers every "
                         "SEQUENCE; nfs4_setup_sequence misses slots handed over at wake-up)")
    ap.add_argument("--local-then-copy", action="store_true",
                    help="each rank saves to a local tmpfs, then copies its files to NFS in 1 MiB buffered "
                         "writes (guest/writer.py): its wall_s is the blocking save, copy_s the copy")
    ap.add_argument("--nfsd-threads", type=int, default=16)
    ap.add_argument("--export-fs", choices=("disk", "tmpfs", "slowdisk"), default="disk",
                    help="what the server exports: a directory on the VM's ext4 disk (its syncs go "
                         "through the journal, whose timing varies under TCG), a tmpfs, or an ext4 on a "
                         "RAM disk whose every I/O takes --disk-ms (null_blk: on the guest's clock)")
    ap.add_argument("--disk-ms", type=float, default=5, help="with --export-fs slowdisk: each I/O's time")
    ap.add_argument("--icount", type=int, metavar="SHIFT",
                    help="under TCG, run the guest on an instruction-counting clock, one vCPU: each "
                         "emulated instruction is 2**SHIFT ns of guest time, so the host's speed and load do "
                         "not enter guest timings (bench/overhead.py; vmrig/vm.py icount_args)")
    ap.add_argument("--doctor-load", action="store_true",
                    help="the boot's `slotscope doctor` also compiles and loads the probes (--load): one more BPF "
                         "compile per boot, the only check of BCC against the kernel's headers; doctor.txt")
    ap.add_argument("--agent-start-timeout", type=float, default=240,
                    help="seconds to wait for the agent's 'recording' line (BCC compiles slowly under TCG)")
    ap.add_argument("--agent-stop-timeout", type=float, default=120)
    ap.add_argument("--writer-timeout", type=float, default=600,
                    help="writer deadline inside the VM; on expiry blocked tasks are dumped to hang.txt")
    ap.add_argument("--timeout", type=float, default=900,
                    help="a scenario still running after this many seconds is hung: its VM is killed (and "
                         "the scenarios after it in that boot run in a fresh one)")
    return ap


def check(ap, a):
    if (a.server_freeze_at is None) != (a.server_freeze_for is None):
        ap.error("--server-freeze-at and --server-freeze-for go together")
    if a.slots is not None and a.slots < (2 if a.nfs_vers == "3" else 1):
        ap.error("--slots: at least 2 for NFSv3 (sunrpc minimum), 1 for NFSv4.1+")
    if a.nconnect is not None and not 1 <= a.nconnect <= 16:
        ap.error("--nconnect must be 1-16")
    if a.ranks < 1 or a.write_size < 1 or a.file_mb <= 0 or a.files_per_rank < 1:
        ap.error("--ranks, --write-size, --file-mb and --files-per-rank must be positive")
    if a.icount is not None and not 0 <= a.icount <= 10:
        ap.error("--icount: a shift of 0-10 (2**SHIFT ns per instruction)")
    if a.compare_agent is not None:
        if a.compare_agent < 1 or a.compare_repeat < 1:
            ap.error("--compare-agent, --compare-repeat: at least 1")
        if a.no_agent or a.server_freeze_at is not None:
            ap.error("--compare-agent runs the agent itself and cannot freeze the server")
    if a.client and (a.compare_agent is not None or a.rank_override or a.server_freeze_at is not None
                     or a.local_then_copy):
        ap.error("--client runs a real job: no --compare-agent, --rank-override, --server-freeze-at or "
                 "--local-then-copy")
    if a.state_mb <= 0 or a.saves < 1 or a.save_every < 0:
        ap.error("--state-mb and --saves must be positive, --save-every not negative")
    for ev in a.ftrace:
        if ev.count(":") != 1 or "/" in ev or ".." in ev:
            ap.error(f"--ftrace {ev!r}: want SYSTEM:EVENT")
    if a.nodes > 1 and (a.ranks % a.nodes or a.server_freeze_at is not None
                        or a.compare_agent is not None or a.agent_user):
        ap.error("--nodes 2: --ranks a multiple of the nodes; no --server-freeze-at, --compare-agent "
                 "or --agent-user")
    for node, mbit in a.node_rate_mbit:
        if not 1 <= node <= a.nodes or mbit <= 0:
            ap.error(f"--node-rate-mbit: node {node} is not in 1..{a.nodes}, or the rate is not positive")
    for rank, _ in a.rank_override:
        if not 0 <= rank < a.ranks:
            ap.error(f"--rank-override: rank {rank} is not in 0..{a.ranks - 1}")
    late = {rank for rank, fields in a.rank_override if "after_s" in fields}
    if len(late) == a.ranks or (late and (a.compare_agent is not None or a.nodes > 1)):
        ap.error("--rank-override after-s: some ranks must start at once; not with --compare-agent or --nodes 2")
    if a.watch and (a.no_agent or a.nodes > 1 or a.agent_user or a.client):
        ap.error("--watch: the agent watches one node's writers as root: no --no-agent, --nodes 2, --agent-user "
                 "or --client")


def spec_of(a):
    return {
        "nfs_vers": a.nfs_vers, "nconnect": a.nconnect, "wsize": a.wsize,
        "timeo": a.timeo, "retrans": a.retrans, "slots": a.slots,
        "dirty_background_bytes": a.dirty_background_bytes,
        "delay_ms": a.delay_ms, "rate_mbit": a.rate_mbit, "loss_pct": a.loss_pct,
        "ranks": a.ranks, "write_size": a.write_size, "mode": a.mode, "file_mb": a.file_mb,
        "files_per_rank": a.files_per_rank,
        "rank_overrides": {str(r): f for r, f in a.rank_override},
        "freeze_at": a.server_freeze_at, "freeze_for": a.server_freeze_for,
        "agent": not a.no_agent, "agent_args": a.agent_args.split(), "agent_user": a.agent_user,
        "local_then_copy": a.local_then_copy, "nfsd_threads": a.nfsd_threads, "doctor_load": a.doctor_load, "agent_start_timeout": a.agent_start_timeout,
        "agent_stop_timeout": a.agent_stop_timeout, "writer_timeout": a.writer_timeout,
        "compare_agent": a.compare_agent,
        "compare_repeat": a.compare_repeat if a.compare_agent else None, "ftrace": a.ftrace, "export_fs": a.export_fs,
        **({"disk_ms": a.disk_ms} if a.export_fs == "slowdisk" else {}),
        **({"nodes": a.nodes, "node_rate_mbit": {str(n): r for n, r in a.node_rate_mbit}} if a.nodes > 1 else {}),
        **({"watch": True} if a.watch else {}),
        **({"agent_profile": True} if a.agent_profile else {}),
        "clients": a.client, **({"state_mb": a.state_mb, "saves": a.saves, "save_every": a.save_every}
                                if a.client else {}),
    }


def expected_bytes(spec, ranks=()):
    """What the server must hold after the scenario: the rig's writers write what the spec
    says; a real client writes what its library makes of the state dict, which each rank
    reports (`ranks` of scenario.json)."""
    if spec.get("clients"):
        return sum(r["bytes"] for r in ranks)
    total = 0
    for rank in range(spec["ranks"]):
        mb = spec["rank_overrides"].get(str(rank), {}).get("file_mb", spec["file_mb"])
        total += int(mb * 2**20) * spec["files_per_rank"]
    return total * (compare_rounds(spec) if spec.get("compare_agent") else 1)


def compare_rounds(spec):
    """Saves in a --compare-agent run: the warm-up, N+1 baseline and N agent blocks of M
    rounds, and an unmeasured first save after each agent start (tests/vm/guest/scenario.py)."""
    n, m = spec["compare_agent"], spec["compare_repeat"]
    return 1 + (2 * n + 1) * m + n


def source_files():
    """What a VM run executes from the checkout: the command, the agent, the capture format,
    BPF programs, guest scripts, packaging."""
    return [REPO / "pyproject.toml", *(f for pkg in GUEST_PACKAGES for f in sorted((REPO / pkg).rglob("*.py"))),
            *sorted((REPO / "bpf").glob("*.[ch]")), *sorted((VM_DIR / "guest").glob("*"))]


def source_key():
    """Hash of source_files(): results made with another key came from other code."""
    h = hashlib.sha256()
    for f in source_files():
        if f.is_file():
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def log(msg):
    print(f"[run-scenario] {msg}", file=sys.stderr, flush=True)


class Watchdog:
    """Reads the guest's progress file (tests/vm/guest/scenario.py) each second: a boot whose
    first scenario has not started within boot_budget s, or a scenario still running after
    scenario_budget s, is hung (its name in the reason)."""

    def __init__(self, progress: Path, boot_budget: float, scenario_budget: float):
        self.progress, self.boot_budget, self.scenario_budget = progress, boot_budget, scenario_budget
        self.current, self.since = None, time.monotonic()
        self.started: list[str] = []
        self.hung: str | None = None

    def __call__(self):
        try:
            lines = self.progress.read_text().splitlines()
        except OSError:
            lines = []
        starts = [line.split(" ", 1)[1] for line in lines if line.startswith("start ")]
        if len(starts) > len(self.started):
            self.started, self.since = starts, time.monotonic()
            self.current = starts[-1]
        if self.current and f"end {self.current}" in lines:
            self.current = None
        waited = time.monotonic() - self.since
        if self.current and waited > self.scenario_budget:
            self.hung = self.current
            return f"scenario {self.current} hung: still running after {self.scenario_budget:.0f} s"
        if not self.started and waited > self.boot_budget:
            return f"no scenario started within {self.boot_budget:.0f} s of the boot"
        return None


def run(a):
    """Run the scenario described by parsed options a, results in a.out; return its record."""
    out = a.out.resolve()
    if out.exists() and any(out.iterdir()):
        raise ScenarioFailed(f"{out} exists and is not empty")
    record = run_many([(out.name, spec_of(a), out)], a.kernel, a.icount, a.timeout)[out.name]
    if isinstance(record, Exception):
        raise record
    record["options"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    (out / "scenario.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def boot_key(spec):
    """What scenarios sharing a boot must have in common: one export and one agent (and its
    user) serve them all, and the overhead mode runs its own agents; a boot of two nodes is a
    pair of VMs, a watching boot may have the metrics' NIC and Prometheus (each runs one scenario:
    own_boot)."""
    return (spec["export_fs"], spec.get("disk_ms"), spec["agent"], tuple(spec["agent_args"]), spec.get("agent_user"),
            spec["compare_agent"], spec.get("nodes", 1), spec.get("doctor_load"), spec.get("watch"))


def own_boot(spec):
    """A scenario that a boot runs alone: a pair of VMs (node 2's guest has no reset), or watch
    scraped by the host (its agent is not handed from scenario to scenario, and the boot's
    Prometheus data is its own)."""
    return spec.get("nodes", 1) > 1 or host_scraped(spec)


def host_scraped(spec):
    """Whether a watching agent's metrics go through the metrics NIC to a Prometheus on the host.
    Not the overhead bench's (--compare-agent): it needs neither, the guest scrapes them itself."""
    return bool(spec.get("watch")) and not spec.get("compare_agent")


# The overhead bench's watch serves its metrics on the client namespace's loopback, scraped from
# inside the guest at a fleet Prometheus's usual interval (its cost is the agent's serving).
BENCH_METRICS, BENCH_SCRAPE_S = "127.0.0.1:9465", 15


def metrics_spec(spec):
    """What a guest's spec adds for a watching agent: where it serves its metrics, how often they
    are scraped, and whether by the host through the metrics NIC."""
    if not spec.get("watch"):
        return {}
    if host_scraped(spec):
        return {"metrics": "%s:%d" % GUEST_METRICS, "scrape_s": prom.SCRAPE_S, "metrics_nic": True}
    return {"metrics": BENCH_METRICS, "scrape_s": BENCH_SCRAPE_S, "metrics_nic": False}


def run_many(scenarios, kernel, icount, scenario_budget=900.0, boot_budget=900.0, log=log, idle=False):
    """Run [(name, spec, out directory)] in as few boots of `kernel` as possible: scenarios of
    one boot_key share a boot, in the order given. A hung scenario is killed with its VM and
    the scenarios after it get a fresh boot. idle: the VMs run on idle CPU time (run_vm).
    -> {name: record, or the ScenarioFailed}."""
    results, groups = {}, {}
    for item in scenarios:
        key = boot_key(item[1])
        if own_boot(item[1]):
            key = (*key, item[0])
        groups.setdefault(key, []).append(item)
    for pending in groups.values():
        while pending:
            done = _boot(pending, kernel, icount, scenario_budget, boot_budget, log, idle)
            results.update(done)
            left = [item for item in pending if item[0] not in done]
            if len(left) == len(pending):       # nothing came of the boot: do not loop
                raise RuntimeError("a boot returned no result")
            if left:
                log(f"rerunning {', '.join(n for n, _, _ in left)} in a fresh boot")
            pending = left
    return results


def _job_share(pending, node):
    """The 9p job share of one VM of a boot: the guest scripts, the specs (with the node each
    VM is), and out/ for what comes back."""
    share = Path(tempfile.mkdtemp(prefix=f"slotscope-boot{'' if node == 1 else node}-", dir=pending[0][2].parent))
    shutil.copytree(VM_DIR / "guest", share / "guest")
    shutil.copy(VM_DIR / "guest/job.sh", share / "job")
    (share / "specs.json").write_text(json.dumps(
        [{"name": n, "spec": {**s, "node": node, **metrics_spec(s)}} for n, s, _ in pending], indent=2))
    (share / "out").mkdir()
    return share


PAIR_GRACE_S = 60   # node 1 waits for node 2's job to end: node 2 still up a minute later is stuck


def _run_pair(run, shares, watches, log):
    """Node 1's VM, then, once it listens on the link's socket, node 2's, each with its watchdog;
    either failing stops the other. -> node 1's Result; raises the first VMError."""
    sock = Path(tempfile.mkdtemp(prefix="slotscope-link-")) / "sock"    # short: a unix socket path
    failed, ended = [], []

    def watched(watch):
        def why():
            if ended and time.monotonic() > ended[0] + PAIR_GRACE_S:
                return f"node 1's VM ended {PAIR_GRACE_S} s ago: node 2 has no server"
            return watch() or (f"the other node's VM failed: {failed[0]}" if failed else None)
        return why

    def node1(result):
        try:
            result.append(run(shares[0], watched(watches[0]), stream_nic(sock, listen=True)))
        except VMError as e:
            failed.append(e)
        ended.append(time.monotonic())
    result = []
    first = threading.Thread(target=node1, args=(result,))
    first.start()
    deadline = time.monotonic() + 120
    while not sock.exists() and first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        if not sock.exists():
            raise VMError(f"node 1's VM did not listen on {sock} within 120 s")
        log("node 2: booting against node 1's link")
        run(shares[1], watched(watches[1]), stream_nic(sock, listen=False))
    except VMError as e:
        failed.append(e)
    first.join()
    shutil.rmtree(sock.parent, ignore_errors=True)
    if failed:
        raise failed[0]
    return result[0]


class Scrape:
    """Prometheus on the host for a watching boot: from before the boot to after it, it scrapes the
    guest's metrics every prom.SCRAPE_S through the port forwarded to them (metrics_nic), on the
    host's clock; its TSDB, config and log in the scenario's results (prometheus/, .yml, .log)."""

    def __init__(self, out):
        if prom.PROMETHEUS is None:
            raise ScenarioFailed("--watch: no prometheus on the host (apt-get install prometheus; dev.sh installs it)")
        self.target = f"127.0.0.1:{prom.free_port()}"
        self.nic = metrics_nic(int(self.target.rpartition(":")[2]))
        self.log = open(out / "prometheus.log", "w")
        self.proc, _ = prom.start(out / "prometheus", [self.target], log=self.log)
        self.since = time.time()

    def stop(self):
        """-> what the boot's record says of it: the target, and the host's UTC s it scraped from and to."""
        prom.stop(self.proc)
        self.log.close()
        return {"target": self.target, "from": self.since, "to": time.time()}


def _boot(pending, kernel, icount, scenario_budget, boot_budget, log, idle=False):
    """One boot running `pending` in order; -> {name: record or ScenarioFailed} for the
    scenarios it ran or hung in (those it never started are left out). With two nodes, a pair
    of VMs: node 2's results go to OUT/node2."""
    sources = source_key()  # before the run: the checkout may change meanwhile
    t0 = time.monotonic()
    image = ensure_image(kernel=kernel)
    image_seconds = round(time.monotonic() - t0, 1)
    for _, _, out in pending:
        out.mkdir(parents=True, exist_ok=True)
    nodes = pending[0][1].get("nodes", 1)
    shares = [_job_share(pending, node) for node in range(1, nodes + 1)]
    watches = [Watchdog(share / "out" / "progress", boot_budget, scenario_budget) for share in shares]
    share, watch = shares[0], watches[0]
    boot_id = f"{kernel}-{share.name}"
    failure = rc = None
    vm_seconds = 0.0
    scrape = Scrape(pending[0][2]) if host_scraped(pending[0][1]) else None     # own_boot: the one scenario

    def run(share, watch, net=()):
        return run_vm(image, kernel, share, share / "console.log", boot_budget + scenario_budget * len(pending),
                      shares=[Share("src", REPO, readonly=True)], log=log, icount=icount, watch=watch, net=net,
                      idle=idle)
    try:
        res = run(share, watch, scrape.nic if scrape else ()) if nodes == 1 else _run_pair(run, shares, watches, log)
        rc, vm_seconds, accel, clock = res.rc, res.seconds, res.accel, res.clock
    except VMError as e:
        failure = str(e)
        accel, clock = "?", "?"
        vm_seconds = round(time.monotonic() - t0 - image_seconds, 1)
    finally:
        scraped = scrape.stop() if scrape else None
    boot = _read_json(share / "out" / "boot.json") or {}
    boot.update({"id": boot_id, "kernel": kernel, "scenarios": [n for n, _, _ in pending], "vm_seconds": vm_seconds,
                 **({"prometheus": scraped} if scraped else {})})
    done = {}
    for name, spec, out in pending:
        for node, (share_n, watch_n) in enumerate(zip(shares, watches), 1):
            dest = out if node == 1 else out / f"node{node}"
            dest.mkdir(exist_ok=True)
            ran = share_n / "out" / name
            for f in (share_n / "console.log", share_n / "job.log"):
                if f.exists():
                    shutil.copy(f, dest / f.name)
            if not ran.exists():
                continue
            for f in ran.iterdir():
                shutil.move(f, dest / f.name)
            if watch_n.hung == name:
                (dest / "error.txt").write_text(f"{failure}\n")
                done[name] = ScenarioFailed(f"{failure}\n(see {dest}/console.log)")
            else:       # the scenario's outcome is node 1's record, or the first failure
                record = _scenario_record(name, spec, dest, boot, sources, image, image_seconds, accel, clock)
                if node == 1 or (isinstance(record, Exception) and not isinstance(done.get(name), Exception)):
                    done[name] = record
    if not done:    # the boot failed before its first scenario
        why = failure or _read_text(share / "out" / "error.txt") or f"the job exited with status {rc}"
        done = {name: ScenarioFailed(f"the boot failed before scenario {name}: {why}\n(see {out}/job.log "
                                     f"and console.log)") for name, _, out in pending}
    for share_n in shares:
        shutil.rmtree(share_n, ignore_errors=True)
    log(f"boot {boot_id}: {len(done)} of {len(pending)} scenarios, VM {vm_seconds} s (job status {rc})")
    return done


def _read_text(path):
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _scenario_record(name, spec, out, boot, sources, image, image_seconds, accel, clock):
    """scenario.json for one scenario of a boot; -> the record, or ScenarioFailed."""
    guest = _read_json(out / "guest.json")
    error = _read_text(out / "error.txt")
    if guest is None:
        return ScenarioFailed(f"scenario {name} {'failed in the VM: ' + error if error else 'left no results'}"
                              f"\n(see {out}/job.log and console.log)")
    (out / "guest.json").unlink()
    record = {"spec": spec, "image": image.manifest["key"], "source_key": sources, "accel": accel,
              "clock": clock, "kernel_abi": image.manifest["kernels"][boot["kernel"]]["abi"],
              "host_seconds": {"image_check": image_seconds, "vm": boot["vm_seconds"]},
              "boot": boot, "boot_seconds": boot.get("boot_seconds"),
              "expected_bytes": expected_bytes(spec, guest.get("ranks", ())), **guest}
    (out / "scenario.json").write_text(json.dumps(record, indent=2) + "\n")
    if error:
        return ScenarioFailed(f"scenario {name} failed in the VM: {error}\n(see {out}/job.log and console.log)")
    if "server_bytes" in record and record["server_bytes"] != record["expected_bytes"]:  # node 1 holds the server
        return ScenarioFailed(f"scenario {name}: the server has {record['server_bytes']} bytes, expected "
                              f"{record['expected_bytes']} (see {out}/scenario.json)")
    return record


def summary(out):
    """A few lines: per-rank wall times and the WRITE line deltas from mountstats."""
    rec = json.loads((out / "scenario.json").read_text())
    walls = [r["wall_s"] for r in rec["ranks"]]
    lines = [f"{len(walls)} ranks wrote {rec['server_bytes']} bytes (server side); "
             f"wall min/max {min(walls):.2f}/{max(walls):.2f} s; VM {rec['host_seconds']['vm']} s "
             f"({rec['accel']}, clock {rec.get('clock', 'wall')}, kernel {rec['kernel']})"]
    delta = mountstats.delta(mountstats.parse((out / "mountstats.before").read_text()),
                             mountstats.parse((out / "mountstats.after").read_text()))
    w = delta["ops"].get("WRITE")
    if w:
        lines.append("WRITE: " + mountstats.describe(w))
    lines += [f"xprt: {x}" for x in delta["xprt_lines"]]
    for r in rec.get("rounds", ()):
        lines.append(f"round {r['label']}: {r['bytes']} bytes in {r['wall_s']:.2f} s, "
                     f"{r['bytes_per_s'] / 2**20:.3f} MiB/s")
    return "\n".join(lines)


def named(names, kernel, out_root, **budgets):
    """Run scenarios of vmrig/scenarios.py on `kernel`, results in out_root/<name>, as few
    boots as their clocks and boot_key allow. -> {name: record or ScenarioFailed}."""
    from .scenarios import NAMED
    by_clock = {}
    for name in names:
        a = parser().parse_args(["--out", str(out_root / name), *NAMED[name]])
        by_clock.setdefault(a.icount, []).append((name, spec_of(a), out_root / name))
    results = {}
    for icount, items in by_clock.items():
        results.update(run_many(items, kernel, icount, **budgets))
    return results


def main(argv=None):
    from .scenarios import NAMED
    ap = parser()
    ap.add_argument("--named", action="append", choices=sorted(NAMED), metavar="NAME",
                    help="run this scenario of vmrig/scenarios.py (repeatable; the other scenario options "
                         "are then ignored): results in OUT/NAME, scenarios on one clock share a boot")
    a = ap.parse_args(argv)
    check(ap, a)
    try:
        if a.named:
            results = named(a.named, a.kernel, a.out.resolve(), scenario_budget=a.timeout)
            failed = {n: r for n, r in results.items() if isinstance(r, Exception)}
            for n, r in results.items():
                log(f"{n}: {r if n in failed else 'done'}")
                if n not in failed:
                    print(f"== {n}\n{summary(a.out.resolve() / n)}")
            return 1 if failed else 0
        run(a)
    except (ScenarioFailed, BuildError) as e:
        log(f"FAILED: {e}")
        return 1
    log(f"results in {a.out}")
    print(summary(a.out.resolve()))
    return 0
