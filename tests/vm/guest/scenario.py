"""Runs inside the VM: the NFS scenarios listed in /job/specs.json, one after the other.

Topology: the NFS server in the initial network namespace (veth0, 10.0.0.1), the
client in namespace "cli" (veth1, 10.0.0.2), tc shaping on both ends. Mount, agent,
writers and the before/after readings all run in the client's network namespace;
they share the initial mount namespace, where the mount lives.

Once per boot: the project's install, the link, the server and the agent (whose BCC
compile is the longest step under TCG: it records one capture per scenario, SIGUSR1
starting the next). Between scenarios everything a scenario sets is reset (reset()):
the mount, the exported files, the sysctls, the shaping, the server's threads, the
kernel log. Each scenario's results go to /job/out/<name>, a failure's message to its
error.txt; /job/out/progress says which scenario runs (the host's watchdog reads it),
/job/out/boot.json what the boot's own steps took.
"""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nodes

JOB = Path("/job")
RESULTS = JOB / "out"
OUT = RESULTS   # the running scenario's results directory (main() sets it)
SRC = Path("/src")
VENV_PY = "/opt/slotscope-venv/bin/python"
TORCHRUN = "/opt/slotscope-venv/bin/torchrun"
SERVER, CLIENT = "10.0.0.1", "10.0.0.2"
NODE_ADDR = {1: "10.0.1.1", 2: "10.0.1.2"}   # the two VMs' link (--nodes 2): eth0 of each
MASTER_PORT = 29500     # a real job over two nodes: torchrun's store, with node 1's ranks (CLIENT)
CLI = ["nsenter", "--net=/run/netns/cli"]
EXPORT = Path("/export")
MNT = "/mnt/nfs"
CKPT = "ckpt"
RANKS_CODE = Path("/opt/rig")   # the ranks' scripts, copied out of the root-only job share
LOCAL = Path("/var/local-ckpt")  # --local-then-copy: the client's local disk, a tmpfs
CAPTURE = Path("/var/tmp/capture")  # local disk: never onto the traced mount
CAPTURES = "/var/tmp/capture-{n}"  # the boot's agent: one capture per scenario, and one between each two
INCIDENTS = Path("/var/tmp/incidents")  # --watch: watch's --out
T0 = time.monotonic()
timings = {}
PEER = None     # with two nodes: node 1's nodes.Peer, node 2's nodes.Control
CLOCK_SYNC = {}     # node 2: its clock's step to node 1's (nodes.Control.step_clock)


class ScenarioError(RuntimeError):
    pass


AGENT_UID = 1000


def as_user(spec):
    """What runs a command as the scenario's ordinary user, if it has one: after nsenter (which
    needs root), so the user's processes live in the client's network namespace."""
    user = spec.get("agent_user")
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"] if user else []


def node_of(spec):
    return spec.get("node", 1)


def server_addr(spec):
    return NODE_ADDR[1] if node_of(spec) > 1 else SERVER


def node_ranks(spec):
    """This node's ranks: the job's, split in order between its nodes."""
    per = spec["ranks"] // spec.get("nodes", 1)
    return range((node_of(spec) - 1) * per, node_of(spec) * per)


def make_user(user):
    """The ordinary user of --agent-user, owning the export's checkpoint directory (the export
    keeps uids as they are: no_root_squash and no idmapping)."""
    if subprocess.run(["getent", "passwd", user], capture_output=True).returncode:
        sh("useradd", "--uid", str(AGENT_UID), "--user-group", "--no-create-home", "--home-dir", "/tmp",
           "--shell", "/bin/sh", user)
    os.chown(EXPORT / CKPT, AGENT_UID, AGENT_UID)


def log(msg):
    print(f"[guest +{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# the deadline of a boot's own steps that wait for the host many times (install, doctor): on the
# instruction clock each wait costs guest time (vmrig/vm.py icount_args), and a boot on idle CPU
# time beside the other tiers (tests/vm/conftest.py) waits long: its install took 3,704 s of guest
# time in a CI run. The host's watchdog (its own clock, before the first scenario) catches a hang.
SETUP_TIMEOUT = 4 * 3600


def sh(*cmd, timeout=120):
    p = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != 0:
        raise ScenarioError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stdout.strip()}")
    return p.stdout


def timed(name):
    """Decorator: log and record how long a step took."""
    def wrap(fn):
        def inner(*a, **kw):
            t = time.monotonic()
            r = fn(*a, **kw)
            timings[name] = round(time.monotonic() - t, 2)
            log(f"{name}: {timings[name]} s")
            return r
        return inner
    return wrap


def copy_live(src, dst):
    """Copy one file of the checkout, which may be edited meanwhile: an editor that saves
    by rename makes a file vanish for an instant, so retry before giving up on it."""
    for _ in range(10):
        try:
            return shutil.copy2(src, dst)
        except FileNotFoundError:
            time.sleep(0.2)
    log(f"skipped {src}: it vanished from the checkout during the copy")
    return dst


@timed("install_project")
def install_project():
    """Install the checkout under test from the read-only source share, fresh each run."""
    SRC.mkdir(exist_ok=True)
    sh("mount", "-t", "9p", "-o", "trans=virtio,version=9p2000.L,msize=262144,ro", "src", str(SRC))
    copy = Path("/tmp/src")
    shutil.copytree(SRC, copy, copy_function=copy_live, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "build", ".pytest_cache", "out", ".job"))
    sh(VENV_PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
       "--disable-pip-version-check", str(copy), timeout=SETUP_TIMEOUT)
    shutil.copytree(JOB / "guest", RANKS_CODE)


@timed("modules")
def load_modules(spec):
    for m in ("sunrpc", "nfsd", "nfs", "nfsv3", "nfsv4", "veth", "sch_netem", "sch_tbf",
              *(["virtio_net"] if spec.get("nodes", 1) > 1 or spec.get("metrics_nic") else [])):
        sh("modprobe", m)


@timed("doctor")
def doctor(spec):
    """`slotscope doctor` once the modules are in, as a user runs it before recording (with
    --load if the boot's first scenario asks): what it says goes to doctor.txt with its exit
    status (its verdict, not a failure of the boot)."""
    p = subprocess.run(["slotscope", "doctor", *(["--load"] if spec.get("doctor_load") else [])], check=False, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=SETUP_TIMEOUT)
    (RESULTS / "doctor.txt").write_text(f"{p.stdout}exit status {p.returncode}\n")


def set_slots(spec):
    """The slot limit differs by protocol: NFSv3 uses the sunrpc TCP slot table,
    NFSv4.1+ ignores it and is limited by the session's fore channel slots. Both must
    be set before the mount creates the transport / client."""
    n = spec["slots"]
    if n is None:
        return
    if spec["nfs_vers"] == "3":
        # tcp_slot_table_entries (preallocated) is capped at 128 by the kernel.
        Path("/proc/sys/sunrpc/tcp_slot_table_entries").write_text(str(min(n, 128)))
        Path("/proc/sys/sunrpc/tcp_max_slot_table_entries").write_text(str(n))
    else:
        Path("/sys/module/nfs/parameters/max_session_slots").write_text(str(n))


def netem_args(spec, loss_pct):
    return ["netem", "delay", f"{spec['delay_ms']}ms", "loss", f"{loss_pct}%", "limit", "10000"]


def shape(prefix, dev, spec, change=False):
    """netem (delay, loss) at the root of dev's egress, tbf (rate) under it."""
    verb = "change" if change else "add"
    sh(*prefix, "tc", "qdisc", verb, "dev", dev, "root", "handle", "1:", *netem_args(spec, spec["loss_pct"]))
    if spec["rate_mbit"] and not change:
        burst = max(32 * 1024, int(spec["rate_mbit"] * 1e6 / 8 / 100))  # >= 10 ms at rate
        sh(*prefix, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "tbf",
           "rate", f"{spec['rate_mbit']}mbit", "burst", str(burst), "latency", "200ms")


@timed("link")
def make_link(spec):
    """Node 1: the server's veth to its client namespace, and with two nodes eth0 to node 2.
    Node 2 has no server: its client namespace "cli" is the initial one, holding eth0."""
    if spec.get("nodes", 1) > 1:
        name = f"node{node_of(spec)}"   # each capture's host; torchrun and gloo look it up
        sh("hostname", name)
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"127.0.1.1 {name}\n")
        sh("ip", "addr", "add", f"{NODE_ADDR[node_of(spec)]}/24", "dev", "eth0")
        sh("ip", "link", "set", "eth0", "up")
        if node_of(spec) > 1:
            sh("ip", "netns", "attach", "cli", "1")
            sh("ip", "route", "add", "10.0.0.0/24", "via", NODE_ADDR[1])  # node 1's ranks: a job's store, gloo
            return
    sh("ip", "netns", "add", "cli")
    sh("ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", "cli")
    sh("ip", "addr", "add", f"{SERVER}/24", "dev", "veth0")
    sh("ip", "link", "set", "veth0", "up")
    sh(*CLI, "ip", "addr", "add", f"{CLIENT}/24", "dev", "veth1")
    sh(*CLI, "ip", "link", "set", "veth1", "up")
    sh(*CLI, "ip", "link", "set", "lo", "up")
    if spec.get("metrics_nic"):
        metrics_nic(spec)
    if spec.get("nodes", 1) > 1:    # node 1 forwards between its client and node 2
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        sh(*CLI, "ip", "route", "add", "10.0.1.0/24", "via", SERVER)


def metrics_nic(spec):
    """--watch scraped by the host: the NIC of qemu's user-mode network (vmrig/vm.py metrics_nic:
    nothing reaches out through it; the host reaches the metrics port alone) goes to the client
    namespace, where watch serves its metrics, with the address the host forwards to."""
    addr = spec["metrics"].rpartition(":")[0]
    sh("ip", "link", "set", "eth0", "netns", "cli")
    sh(*CLI, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
    sh(*CLI, "ip", "link", "set", "eth0", "up")


def ranks_device(spec):
    """The device the node's ranks reach the other node by (gloo's GLOO_SOCKET_IFNAME: by host
    name it would take 127.0.1.1, the loopback /etc/hosts gives the name)."""
    return "eth0" if node_of(spec) > 1 else "veth1"


def link_devices(spec):
    """(name in link counters, namespace prefix, netns, device, the node whose link it is) of
    each end this VM shapes: node 1 both ends of its own link and its end of node 2's."""
    if node_of(spec) > 1:
        return [("client_eth0", [], None, "eth0", 2)]
    return [("server_veth0", [], None, "veth0", 1), ("client_veth1", CLI, "cli", "veth1", 1),
            *([("server_eth0", [], None, "eth0", 2)] if spec.get("nodes", 1) > 1 else [])]


def node_link(spec, node):
    """The shaping of one node's link: the scenario's, with that node's --node-rate-mbit."""
    return {**spec, "rate_mbit": spec.get("node_rate_mbit", {}).get(str(node), spec["rate_mbit"])}


def shape_link(spec, reset=False):
    for _, prefix, _, dev, node in link_devices(spec):
        if reset:
            sh(*prefix, "tc", "qdisc", "del", "dev", dev, "root")
        shape(prefix, dev, node_link(spec, node))


def set_link_loss(spec, loss_pct):
    for _, prefix, _, dev, _ in link_devices(spec):
        sh(*prefix, "tc", "qdisc", "change", "dev", dev, "root", "handle", "1:", *netem_args(spec, loss_pct))


@timed("nfs_server")
def start_server(spec):
    EXPORT.mkdir(exist_ok=True)
    if spec.get("export_fs") == "tmpfs":  # no disk and journal behind the server's syncs
        sh("mount", "-t", "tmpfs", "-o", "size=1g", "export", str(EXPORT))
    elif spec.get("export_fs") == "slowdisk":
        # a slow disk on the guest's clock: null_blk keeps the data in RAM and completes each
        # I/O from a timer, disk_ms later (the virtio disk's completions are the host's)
        sh("modprobe", "null_blk", "nr_devices=1", "gb=1", "memory_backed=1", "irqmode=2",
           f"completion_nsec={int(spec['disk_ms'] * 1e6)}")
        sh("mkfs.ext4", "-q", "/dev/nullb0", timeout=SETUP_TIMEOUT)
        sh("mount", "/dev/nullb0", str(EXPORT))
    for d in ("/var/lib/nfs/rpc_pipefs", "/run/rpcbind", EXPORT / CKPT):
        Path(d).mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "nfsd", "nfsd", "/proc/fs/nfsd")
    sh("mount", "-t", "rpc_pipefs", "sunrpc", "/var/lib/nfs/rpc_pipefs")
    Path("/etc/exports").write_text(        # 10.0.0.0/24 node 1's client, 10.0.1.0/24 node 2's link
        f"{EXPORT} 10.0.0.0/23(rw,sync,no_subtree_check,no_root_squash,fsid=0)\n")
    Path("/proc/fs/nfsd/nfsv4gracetime").write_text("10")  # the minimum: first v4 OPENs wait it out
    sh("rpcbind", "-w")
    sh("exportfs", "-ra")
    sh("rpc.mountd")


# What a scenario may change and reset() puts back: the boot's values, read before the first.
# dirty_background_ratio comes back last: writing it zeroes dirty_background_bytes.
TUNABLES = ("/proc/sys/sunrpc/tcp_slot_table_entries", "/proc/sys/sunrpc/tcp_max_slot_table_entries",
            "/sys/module/nfs/parameters/max_session_slots", "/proc/sys/vm/dirty_background_ratio")


def read_tunables():
    return {path: Path(path).read_text().strip() for path in TUNABLES}


def configure(spec):
    """What the scenario sets before its mount: slot limits, writeback, shaping, server threads."""
    set_slots(spec)
    if spec.get("dirty_background_bytes"):
        Path("/proc/sys/vm/dirty_background_bytes").write_text(str(spec["dirty_background_bytes"]))
    if node_of(spec) == 1:
        sh("rpc.nfsd", str(spec["nfsd_threads"]))


@timed("reset")
def reset(tunables):
    """Undo what the scenario before did, so that the next starts as on a fresh boot: its
    mount (a new one gets new counters and a new transport, which takes the slot limit
    then in force), its files on the server, the sysctls, the kernel log."""
    sh(*CLI, "umount", MNT, timeout=60)
    for f in (EXPORT / CKPT).iterdir():
        shutil.rmtree(f) if f.is_dir() else f.unlink()
    for path, value in tunables.items():
        Path(path).write_text(value)
    sh("dmesg", "--clear")


def mount_options(spec):
    opts = [f"vers={spec['nfs_vers']}"]
    if spec["nfs_vers"] == "3":
        opts.append("nolock")  # no statd/lockd in the client namespace
    if spec["nconnect"]:
        opts.append(f"nconnect={spec['nconnect']}")
    if spec["wsize"]:
        opts.append(f"wsize={spec['wsize']}")
    for name in ("timeo", "retrans"):
        if spec.get(name):
            opts.append(f"{name}={spec[name]}")
    return ",".join(opts)


@timed("mount")
def mount(spec):
    path = str(EXPORT) if spec["nfs_vers"] == "3" else "/"  # fsid=0: the v4 pseudo-root
    Path(MNT).mkdir(parents=True, exist_ok=True)
    sh(*CLI, "mount", "-t", "nfs", "-o", mount_options(spec), f"{server_addr(spec)}:{path}", MNT, timeout=120)
    return mount_options(spec)


def link_counters(spec):
    """Byte counters of the link's ends in this VM, read over netlink like the agent does."""
    from pyroute2 import IPRoute, NetNS
    res = {}
    for name, _, netns, dev, _ in link_devices(spec):
        with (NetNS(netns) if netns else IPRoute()) as ipr:
            stats = ipr.get_links(ifname=dev)[0].get_attr("IFLA_STATS64")
        res[name] = {"rx_bytes": stats["rx_bytes"], "tx_bytes": stats["tx_bytes"],
                     "rx_packets": stats["rx_packets"], "tx_packets": stats["tx_packets"]}
    return res


def snapshot(tag, spec):
    """mountstats is per mount namespace and /proc/net/rpc/nfs per network
    namespace: read both from a process in the client's namespaces."""
    (OUT / f"mountstats.{tag}").write_text(sh(*CLI, "cat", "/proc/self/mountstats"))
    (OUT / f"nfsstat.{tag}").write_text(sh(*CLI, "nfsstat", "-c"))
    (OUT / f"sunrpc.{tag}").write_text(sunrpc_state())
    return link_counters(spec)


def sunrpc_state():
    """The kernel's own view of the RPC clients and transports (sysfs, debugfs), for reference."""
    parts = []
    for root in ("/sys/kernel/sunrpc", "/sys/kernel/debug/sunrpc"):
        for path in sorted(Path(root).rglob("*")) if Path(root).is_dir() else ():
            if path.is_file() and not path.is_symlink():
                try:
                    parts.append(f"== {path}\n{path.read_text(errors='replace')}")
                except OSError as e:
                    parts.append(f"== {path}: {e.strerror}")
    return "\n".join(parts) + "\n"


def exit_status(rc):
    return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"


# watch analyses its incidents in the guest, the only analysis the rig runs there: under TCG
# (-cpu max, QEMU 7.2's AVX2) pyarrow's AVX2 kernels charged four of the watched storm's eight
# ranks none of their WRITEs (two runs) or died with SIGSEGV in acero's group_by (two of two
# analyses of that incident), where with its scalar kernels the analysis charged all eight, as
# on the host. Watch and its analysis (a child) get the scalar ones.
ARROW_SCALAR = {"ARROW_USER_SIMD_LEVEL": "NONE"}


class Agent:
    """`slotscope record` in the client namespace; ready once it says "recording to" the
    capture wanted. With `path` holding {n}, next() ends the capture and starts the next. With
    --watch, `slotscope watch` serving its metrics at spec["metrics"]: ready once it says
    "watching"; it opens, writes and analyses incidents in INCIDENTS on its own. Metrics the host
    does not scrape (the overhead bench's) are scraped from here, every spec["scrape_s"], while
    it runs."""

    def __init__(self, spec, path=CAPTURE):
        self.spec, self.scraper = spec, None
        self.log = open(RESULTS / "agent.log", "w")     # copied into each scenario's results
        self.path, self.number = str(path), 1
        slotscope = ["slotscope"]
        if spec.get("agent_profile"):
            slotscope = [VENV_PY, "-m", "cProfile", "-o", str(OUT / f"agent-{time.monotonic_ns()}.prof"),
                         "-m", "slotscope.cli.main"]
        if spec.get("watch"):
            cmd = [*CLI, *slotscope, "watch", "--out", str(INCIDENTS), "--fs", "nfs", "--metrics", spec["metrics"],
                   *spec["agent_args"]]
        else:
            cmd = [*CLI, *as_user(spec), *slotscope, "record", "-o", self.path, "--fs", "nfs", *spec["agent_args"]]
        self.watching = bool(spec.get("watch"))
        log(f"agent: {' '.join(cmd)}")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **(ARROW_SCALAR if self.watching else {})))
        self.recording = None       # the capture it last said it records to
        self.lines = []             # all it said
        self.said = threading.Condition()
        threading.Thread(target=self._read_output, daemon=True).start()

    @property
    def capture(self):
        return Path(self.path.replace("{n}", str(self.number)))

    def _read_output(self):
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            with self.said:
                self.lines.append(line)
                if "recording to " in line:
                    self.recording = line.split("recording to ", 1)[1].split(" ", 1)[0]
                self.said.notify_all()

    def tail(self):
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-20:])

    def _wait(self, done, timeout, what, wanted):
        """Until done() holds (under the lock of what the agent said); a dead agent or the
        timeout fails the scenario."""
        deadline = time.monotonic() + timeout
        with self.said:
            while not done():
                self.said.wait(0.5)
                if self.proc.poll() is not None:
                    raise ScenarioError(f"agent {exit_status(self.proc.returncode)} before {what}:\n{self.tail()}")
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise ScenarioError(f"agent did not say {wanted} within {timeout} s ({what}):\n{self.tail()}")

    def _wait_recording(self, timeout, what):
        self._wait(lambda: self.recording == str(self.capture), timeout, what, f"'recording to {self.capture}'")

    @timed("agent_start")
    def wait_ready(self, timeout):
        if self.watching:
            self._wait(lambda: any(" slotscope: watching (" in line for line in self.lines), timeout, "watching",
                       "'watching'")
            if not self.spec.get("metrics_nic"):
                self.scraper = subprocess.Popen(
                    [*CLI, VENV_PY, str(RANKS_CODE / "scrape.py"), f"http://{self.spec['metrics']}/metrics",
                     str(self.spec["scrape_s"])], stdout=subprocess.PIPE, text=True)
        else:
            self._wait_recording(timeout, "recording")

    def opened(self):
        """How many incidents watch has said it opened."""
        with self.said:
            return sum(" opened: " in line for line in self.lines)

    def wait_incidents(self, timeout):
        """--watch: until no incident is open: each one it said it opened has been written and
        analysed (or failed: a warning naming it). Two drains first, so that an incident opened by
        the rows of the writers' last moments is seen."""
        from slotscope.agent.probes import DRAIN_EVERY
        time.sleep(2 * DRAIN_EVERY)

        def settled():
            said = "".join(self.lines)
            return said.count(" opened: ") == said.count(" written and ") + said.count("warning: incident ")
        self._wait(settled, timeout, "its incidents were written and analysed", "each incident written and analysed")

    def next(self, timeout):
        """End the capture (returned, complete) and start the next."""
        done = self.capture
        self.proc.send_signal(signal.SIGUSR1)
        self.number += 1
        self._wait_recording(timeout, f"ending {done}")
        return done

    @timed("agent_stop")
    def stop(self, timeout, how=signal.SIGINT):
        """Stop it (and the scraper: -> its scrapes, {"ok": n, "failed": [what each failure said]})."""
        scrapes = None
        if self.scraper is not None:
            self.scraper.terminate()
            said = self.scraper.communicate(timeout=30)[0].splitlines()
            scrapes = {"ok": said.count("ok"), "failed": [line for line in said if line != "ok"]}
        self.proc.send_signal(how)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise ScenarioError(f"agent still running {timeout} s after {how.name}:\n{self.tail()}") from None
        if rc != 0:
            raise ScenarioError(f"agent {exit_status(rc)}:\n{self.tail()}")
        return scrapes


def rank_params(spec, rank):
    p = {"write_size": spec["write_size"], "mode": spec["mode"], "file_mb": spec["file_mb"]}
    p.update(spec["rank_overrides"].get(str(rank), {}))
    return p


def dump_hang(procs):
    """Evidence for a writer deadline: blocked tasks and kernel stacks."""
    Path("/proc/sysrq-trigger").write_text("w")  # blocked tasks -> kernel log
    lines = []
    for rank, p in procs.items():
        if p.poll() is None:  # nsenter execs the writer: p.pid is the writer
            lines.append(f"--- rank {rank} pid {p.pid}\n{Path(f'/proc/{p.pid}/stack').read_text()}")
    for f in Path("/sys/kernel/debug/sunrpc/rpc_clnt").glob("*/tasks"):
        lines.append(f"--- {f}\n{f.read_text()[:4000]}")
    (OUT / "hang.txt").write_text("\n".join(lines) + "\n")


class Freeze(threading.Thread):
    """Makes the server unreachable (netem loss 100% both ways) for a while."""

    def __init__(self, spec, t_go):
        super().__init__(daemon=True)
        self.spec, self.t_go, self.window = spec, t_go, None

    def run(self):
        time.sleep(max(0.0, self.t_go + self.spec["freeze_at"] - time.monotonic()))
        start = time.monotonic()
        set_link_loss(self.spec, 100)
        log("server frozen (link drops everything)")
        time.sleep(self.spec["freeze_for"])
        set_link_loss(self.spec, self.spec["loss_pct"])
        log("server thawed")
        self.window = [round(start - self.t_go, 3), round(time.monotonic() - self.t_go, 3)]


def local_dir():
    """The ranks' local disk: a tmpfs, mounted at the first scenario that wants it, writable by
    any rank as /tmp is."""
    if not os.path.ismount(LOCAL):
        LOCAL.mkdir(exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "size=1g,mode=1777", "local-ckpt", str(LOCAL))
    return str(LOCAL)


def start_ranks(spec, target, saves=False):
    """The rank processes, each set up and waiting for its go (with `saves`, for a save per
    line: see writer.py)."""
    procs = {}
    ranks = node_ranks(spec)
    local = local_dir() if spec.get("local_then_copy") else None
    for rank in ranks:
        p = rank_params(spec, rank)
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank - ranks[0]), WORLD_SIZE=str(spec["ranks"]))
        procs[rank] = subprocess.Popen(
            [*CLI, *as_user(spec), VENV_PY, str(RANKS_CODE / "writer.py"), "--dir", target,
             "--write-size", str(p["write_size"]), "--mode", p["mode"],
             "--file-bytes", str(int(p["file_mb"] * 2**20)), "--files", str(spec["files_per_rank"]),
             *(["--saves"] if saves else []), *(["--local-dir", local] if local else [])],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for rank, p in procs.items():
        if p.stdout.readline().strip() != "ready":
            raise ScenarioError(f"rank {rank} failed to start (exit {p.wait()})")
    return procs


def save(procs, spec, label, meter):
    """One save by long-lived ranks (start_ranks(saves=True)) into `label`; returns (ranks,
    usage) as writers() does, measured with `meter` (a Usage)."""
    t_go = time.monotonic()
    usage0 = meter.read()
    for p in procs.values():
        p.stdin.write(f"{label}\n")
        p.stdin.flush()
    deadline = t_go + spec["writer_timeout"]
    ranks = []
    for rank, p in procs.items():
        if not select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            dump_hang(procs)
            raise ScenarioError(f"writers still running after {spec['writer_timeout']} s "
                                f"(blocked tasks and stacks in hang.txt)")
        line = p.stdout.readline()
        if not line:
            raise ScenarioError(f"rank {rank} {exit_status(p.wait())}")
        ranks.append(json.loads(line))
    used = meter.since(usage0)
    used["seconds"] = round(time.monotonic() - t_go, 3)
    return ranks, used


def start_together(spec):
    """With two nodes, both nodes' ranks get their go at once: node 2 says it is ready (mounted,
    its agent recording, its ranks started), node 1 says go when its own are ready too. A real
    job's torchrun starts on both after that: its rendezvous joins the nodes."""
    if PEER is None:
        return
    wait = spec["agent_start_timeout"] + spec["writer_timeout"]
    if node_of(spec) > 1:
        PEER.send("ready")
        PEER.wait("go", wait)
    else:
        PEER.wait("ready", wait)
        PEER.send("go")


def end_together(spec, result):
    """Node 2 says it is done (its capture ended), with how far its clock is from node 1's now;
    node 1 waits for it before it lists the server's files and ends its ftrace."""
    if node_of(spec) > 1:
        result["clock_offset_at_end"] = PEER.offset()
        PEER.send("done")
    else:
        PEER.wait("done", spec["writer_timeout"] + spec["agent_stop_timeout"])


def writers(spec, subdir=None, agent=None):
    """Start the ranks together, wait for them; returns (ranks, freeze window, usage):
    usage is the CPU and BPF time the agent (if given) and the whole guest spent
    between the go and the last rank's exit. A rank with after_s starts that many seconds
    after the others have ended and a watching agent has no incident open."""
    procs = start_ranks(spec, f"{MNT}/{CKPT}" + (f"/{subdir}" if subdir else ""))
    late = {rank: rank_params(spec, rank)["after_s"] for rank in procs if "after_s" in rank_params(spec, rank)}
    start_together(spec)
    meter = Usage(agent)
    t_go = time.monotonic()
    usage0 = meter.read()
    freeze = None
    if spec["freeze_at"] is not None:
        freeze = Freeze(spec, t_go)
        freeze.start()
    deadline = t_go + spec["writer_timeout"]

    def go(ranks):
        for rank in ranks:
            procs[rank].stdin.write("go\n")
            procs[rank].stdin.close()

    def wait(ranks):
        while any(procs[rank].poll() is None for rank in ranks):
            if time.monotonic() > deadline:
                dump_hang(procs)
                raise ScenarioError(f"writers still running after {spec['writer_timeout']} s "
                                    f"(blocked tasks and stacks in hang.txt)")
            time.sleep(0.1)
    go([rank for rank in procs if rank not in late])
    log(f"{len(procs) - len(late)} ranks started")
    wait(procs.keys() - late.keys())
    if late:
        if agent is not None and agent.watching:
            agent.wait_incidents(max(0.0, deadline - time.monotonic()))
        ended = time.monotonic()
        for rank in sorted(late, key=late.get):
            time.sleep(max(0.0, ended + late[rank] - time.monotonic()))
            go([rank])
            log(f"rank {rank} started, {late[rank]:g} s after the others ended (and watch's incidents were written)")
        wait(late)
    used = meter.since(usage0)
    used["seconds"] = round(time.monotonic() - t_go, 3)
    meter.close()
    ranks = []
    for rank, p in procs.items():
        out = p.stdout.read().strip()
        if p.returncode != 0 or not out:
            raise ScenarioError(f"rank {rank} {exit_status(p.returncode)}")
        ranks.append(json.loads(out.splitlines()[-1]))
    if freeze:
        freeze.join()
    return ranks, (freeze.window if freeze else None), used


run_writers = timed("writers")(writers)


def torchrun_args(spec):
    """One node's job: --standalone. Over two: this node's share of one job, its ranks in
    order of the nodes (static rendezvous: RANK = node rank x ranks per node + LOCAL_RANK), the
    store on node 1's ranks' address."""
    if spec.get("nodes", 1) == 1:
        return ["--standalone", "--nproc-per-node", str(spec["ranks"])]
    return ["--nnodes", str(spec["nodes"]), "--node-rank", str(node_of(spec) - 1),
            "--nproc-per-node", str(len(node_ranks(spec))), "--master-addr", CLIENT, "--master-port", str(MASTER_PORT)]


def client_job(spec, agent=None):
    """The real checkpointing job (clients.py) launched as users launch it, torchrun with
    gloo; returns (this node's ranks, usage) as writers() does, each rank with its saves as it
    timed them and the files it made (job_ranks() sizes them)."""
    name = "+".join(spec["clients"])
    results = Path("/var/tmp/client-results")
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir()
    if spec.get("agent_user"):
        os.chown(results, AGENT_UID, AGENT_UID)
    cmd = [*CLI, *as_user(spec), TORCHRUN, *torchrun_args(spec), str(RANKS_CODE / "clients.py"),
           *(arg for c in spec["clients"] for arg in ("--client", c)), "--dir", f"{MNT}/{CKPT}",
           "--state-mb", str(spec["state_mb"]),
           "--saves", str(spec["saves"]), "--save-every", str(spec["save_every"]), "--results", str(results)]
    env = dict(os.environ, **({"GLOO_SOCKET_IFNAME": ranks_device(spec)} if PEER else {}))
    start_together(spec)
    meter = Usage(agent)
    t_go = time.monotonic()
    usage0 = meter.read()
    with open(OUT / "client.log", "w") as out:
        job = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        log(f"{name}: {' '.join(cmd)}")
        try:
            rc = job.wait(spec["writer_timeout"])
        except subprocess.TimeoutExpired:
            dump_hang({"torchrun": job})
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            raise ScenarioError(f"{name} still running after {spec['writer_timeout']} s "
                                f"(blocked tasks and stacks in hang.txt, its output in client.log)") from None
    used = meter.since(usage0)
    used["seconds"] = round(time.monotonic() - t_go, 3)
    meter.close()
    if rc != 0:
        tail = "\n".join((OUT / "client.log").read_text(errors="replace").splitlines()[-15:])
        raise ScenarioError(f"{name} (torchrun) {exit_status(rc)}:\n{tail}")
    return [json.loads((results / f"rank{rank}.json").read_text()) for rank in node_ranks(spec)], used


run_client = timed("writers")(client_job)


def sized(r):
    """A real job's rank with its files' sizes as the server holds them (node 1's export)."""
    for s in r["saves"]:
        s["files"] = {f: (EXPORT / CKPT / f).stat().st_size for f in s["files"]}
    r["wall_s"] = round(sum(s["wall_s"] for s in r["saves"]), 4)
    r["files"] = {f: n for s in r["saves"] for f, n in s["files"].items()}
    r["bytes"] = sum(r["files"].values())
    return r


def job_ranks(spec, ranks):
    """A real job's ranks as the records keep them, sized: once both captures have ended, node 2
    sends its own to node 1, which sizes them and keeps the whole job's in its record (the
    server must hold exactly their files), and gets them back sized for its own."""
    if node_of(spec) > 1:
        PEER.send("ranks", ranks)
        return PEER.receive("sized", 120)
    theirs = []
    if PEER is not None:
        theirs = [sized(r) for r in PEER.receive("ranks", 120)]
        PEER.send("sized", theirs)
    return [sized(r) for r in ranks] + theirs


class Usage:
    """Cumulative CPU time (ns): the guest's busy time over all CPUs, and, with an agent,
    its process's user+system time and the run time of its BPF programs (run_time_ns in
    the fdinfo of its program fds, counted while the kernel's BPF statistics are on: record
    turns them on, watch only with --bpf-stats; 0 without). The files are opened once
    and re-read with pread: the agent decodes every process's opens and closes, and the
    measuring must not add to its work in the rounds it measures (reading each of its
    ~100 fdinfo files twice a round did, and the agent's drain showed it)."""

    def __init__(self, agent=None):
        self.tick = 1e9 / os.sysconf("SC_CLK_TCK")
        self.stat = os.open("/proc/stat", os.O_RDONLY)
        self.agent_stat, self.progs = None, []
        if agent is not None:
            pid = agent.proc.pid
            self.agent_stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
            for name in os.listdir(f"/proc/{pid}/fdinfo"):
                try:
                    fd = os.open(f"/proc/{pid}/fdinfo/{name}", os.O_RDONLY)
                except OSError:
                    continue
                if b"run_time_ns:" in os.pread(fd, 4096, 0):
                    self.progs.append(fd)
                else:
                    os.close(fd)

    def read(self):
        busy = [int(x) for x in os.pread(self.stat, 4096, 0).split(b"\n", 1)[0].split()[1:]]
        res = {"guest_busy_ns": int((sum(busy) - busy[3] - busy[4]) * self.tick)}  # minus idle, iowait
        if self.agent_stat is None:
            return res
        stat = os.pread(self.agent_stat, 4096, 0).rsplit(b")", 1)[1].split()
        res["agent_user_ns"] = int(int(stat[11]) * self.tick)
        res["agent_sys_ns"] = int(int(stat[12]) * self.tick)
        res["agent_bpf_ns"] = sum(int(line.split()[1]) for fd in self.progs
                                  for line in os.pread(fd, 4096, 0).splitlines() if line.startswith(b"run_time_ns:"))
        return res

    def since(self, before):
        return {k: v - before[k] for k, v in self.read().items()}

    def agent_rss(self):
        """The agent's resident memory now, bytes (stat's rss: its mapped BPF ring pages count)."""
        stat = os.pread(self.agent_stat, 4096, 0).rsplit(b")", 1)[1].split()
        return int(stat[21]) * os.sysconf("SC_PAGE_SIZE")

    def close(self):
        for fd in [self.stat, *([self.agent_stat] if self.agent_stat is not None else []), *self.progs]:
            os.close(fd)


def server_files():
    """Byte counts of the written files as the server's own filesystem sees them."""
    root = EXPORT / CKPT
    return {str(f.relative_to(root)): f.stat().st_size for f in sorted(root.rglob("*")) if f.is_file()}


TRACING = Path("/sys/kernel/tracing")


def ftrace_start(events):
    """Enable kernel trace events (SYSTEM:EVENT) into the ftrace buffer, for checks
    that need a kernel-side truth the agent does not record."""
    (TRACING / "buffer_size_kb").write_text("8192")
    (TRACING / "trace_clock").write_text("mono")   # CLOCK_MONOTONIC: the capture's clock
    (TRACING / "trace").write_text("")
    for ev in events:
        system, _, name = ev.partition(":")
        (TRACING / "events" / system / name / "enable").write_text("1")
    (TRACING / "tracing_on").write_text("1")


def ftrace_stop(events):
    (TRACING / "tracing_on").write_text("0")
    for ev in events:
        system, _, name = ev.partition(":")
        (TRACING / "events" / system / name / "enable").write_text("0")
    shutil.copy(TRACING / "trace", OUT / "ftrace.txt")


def round_record(label, agent, ranks, used):
    total = sum(r["bytes"] for r in ranks)
    wall = max(r["wall_s"] for r in ranks)
    return {"label": label, "agent": agent, "bytes": total, "wall_s": wall,
            "bytes_per_s": round(total / wall, 1), "usage": used, "ranks": ranks}


def stats_cost(calls=20000):
    """What the kernel's BPF run-time statistics report for a program that returns at once, ns a
    run on this guest's clock: their own clock reads, which every run of ours carries while they are
    on and none when they are off (record's default). A getppid tracepoint, run `calls` times."""
    from bcc import BPF
    from slotscope.agent.probes import enable_bpf_stats
    probe = BPF(text=b"TRACEPOINT_PROBE(syscalls, sys_enter_getppid) { return 0; }")
    stats = enable_bpf_stats()
    try:
        if stats is None:
            return None
        info = f"/proc/self/fdinfo/{next(iter(probe.funcs.values())).fd}"

        def counts():
            fields = dict(line.split(":", 1) for line in open(info).read().splitlines() if ":" in line)
            return int(fields["run_cnt"]), int(fields["run_time_ns"])
        runs0, ns0 = counts()
        for _ in range(calls):
            os.getppid()
        runs1, ns1 = counts()
        return round((ns1 - ns0) / (runs1 - runs0), 1) if runs1 > runs0 else None
    finally:
        if stats is not None:
            os.close(stats)
        probe.cleanup()


SETTLE_S = 3  # after the agent's start (its start-up work, reading /proc, is over), and likewise before a baseline


def compare_agent(spec):
    """The same writers without and with the agent, each round into its own directory:
    a warm-up round (not measured), then `compare_agent` blocks of `compare_repeat`
    rounds without the agent followed by as many with it, and a last block without it,
    so that every agent block has a baseline on either side (the emulated machine's
    speed drifts). One agent start per block (BCC's compile costs ~25 s under TCG), then
    an unmeasured save with it: the agent learns of the ranks, which started before it,
    at their first NFS write (their identities read from /proc, their fds named), as it
    would at their start had it been running already."""
    rounds = []
    # Long-lived ranks, as in training: what is measured is their saves, not their start-up.
    procs = start_ranks(spec, f"{MNT}/{CKPT}", saves=True)
    no_agent = Usage()
    _, used = save(procs, spec, "warmup", no_agent)
    log(f"warm-up round: {used['seconds']} s")

    def block(k, meter, agent=None):
        time.sleep(SETTLE_S)
        for j in range(1, spec.get("compare_repeat", 1) + 1):
            label = f"{'agent' if agent else 'base'}-{k}.{j}"
            opened = agent.opened() if agent else 0
            ranks, used = save(procs, spec, label, meter)
            rounds.append(round_record(label, bool(agent), ranks, used))
            if agent:
                rounds[-1]["agent_rss_bytes"] = meter.agent_rss()
                if agent.watching:
                    rounds[-1]["incidents_opened"] = agent.opened() - opened
            log(f"round {label}: {rounds[-1]['bytes_per_s'] / 2**20:.3f} MiB/s")
            time.sleep(1)

    scrapes = {"ok": 0, "failed": []}
    for k in range(1, spec["compare_agent"] + 1):
        block(k, no_agent)
        shutil.rmtree(CAPTURE, ignore_errors=True)
        agent = Agent(spec)
        agent.wait_ready(spec["agent_start_timeout"])
        meter = Usage(agent)
        _, used = save(procs, spec, f"agent-{k}.warmup", meter)
        log(f"agent warm-up round: {used['seconds']} s")
        block(k, meter, agent)
        meter.close()
        if agent.watching:      # an incident it opened is written (and analysed) before the next block
            agent.wait_incidents(spec["agent_stop_timeout"])
        scraped = agent.stop(spec["agent_stop_timeout"])
        if scraped:
            scrapes["ok"] += scraped["ok"]
            scrapes["failed"] += scraped["failed"]
    block(spec["compare_agent"] + 1, no_agent)
    no_agent.close()
    for p in procs.values():
        p.stdin.close()
        p.wait(timeout=60)
    if spec.get("watch"):
        shutil.copytree(INCIDENTS, OUT / "incidents", dirs_exist_ok=True)
    else:
        shutil.copytree(CAPTURE, OUT / "capture")  # the last agent block's
    return rounds, (scrapes if spec.get("watch") and not spec.get("metrics_nic") else None)


@timed("clock_step")
def step_clock():
    CLOCK_SYNC.update(PEER.step_clock())
    log(f"clock stepped to node 1's: {CLOCK_SYNC}")


def run_one(spec, agent):
    """One scenario on the configured boot, results in OUT; returns the boot's agent (started
    here if the boot has none yet, None without one)."""
    result = {"kernel": os.uname().release, "cpus": os.cpu_count()}
    try:
        configure(spec)
        shape_link(spec, reset=not spec["first"])
        result["mount_options"] = mount(spec)
        result["link_before"] = snapshot("before", spec)
        if spec.get("ftrace") and node_of(spec) == 1:    # the server's VM
            ftrace_start(spec["ftrace"])
        if spec.get("compare_agent"):
            result["rounds"], result["scrapes"] = compare_agent(spec)
            if "--bpf-stats" in spec["agent_args"]:    # the programs' figures, net of their measuring
                result["stats_cost_ns"] = stats_cost()
            result["ranks"], result["freeze_window_s"] = result["rounds"][-1]["ranks"], None
        else:
            if spec["agent"]:
                if agent is not None and agent.proc.poll() is not None:
                    agent = None            # it died in the scenario before: start another
                if agent is None:
                    for d in Path(CAPTURES).parent.glob("capture-*"):
                        shutil.rmtree(d)
                    agent = Agent(spec, CAPTURES)
                    agent.wait_ready(spec["agent_start_timeout"])
                else:       # the capture since the last scenario ends; this one's starts
                    t = time.monotonic()
                    shutil.rmtree(agent.next(spec["agent_start_timeout"]))
                    timings["agent_start"] = round(time.monotonic() - t, 2)
            capture = agent.capture if agent else None
            if spec.get("clients"):
                ranks, result["writers_usage"] = run_client(spec, agent=agent)
                result["freeze_window_s"] = None
            else:
                result["ranks"], result["freeze_window_s"], result["writers_usage"] = run_writers(spec, agent=agent)
            if agent and agent.watching:     # its boot's one scenario (own_boot)
                agent.wait_incidents(spec["agent_stop_timeout"])
                time.sleep(2 * spec["scrape_s"])    # what the last drains counted, scraped by the host
                agent.stop(spec["agent_stop_timeout"], signal.SIGTERM)
                shutil.copytree(INCIDENTS, OUT / "incidents")
                agent = None
            elif agent:
                t = time.monotonic()
                agent.next(spec["agent_stop_timeout"])
                timings["agent_stop"] = round(time.monotonic() - t, 2)
                shutil.copytree(capture, OUT / "capture")
                shutil.rmtree(capture)
        if PEER is not None:
            end_together(spec, result)
        if spec.get("clients"):
            result["ranks"] = job_ranks(spec, ranks)
        if spec.get("ftrace") and node_of(spec) == 1:
            ftrace_stop(spec["ftrace"])
        result["link_after"] = snapshot("after", spec)
        if node_of(spec) == 1:
            result["server_files"] = server_files()
            result["server_bytes"] = sum(result["server_files"].values())
        if CLOCK_SYNC:
            result["clock_sync"] = CLOCK_SYNC
    except (ScenarioError, nodes.NodeError, OSError, subprocess.SubprocessError) as e:
        (OUT / "error.txt").write_text(f"{e}\n")
        log(f"FAILED: {e}")
    finally:
        result["guest_step_seconds"] = dict(timings)
        (OUT / "guest.json").write_text(json.dumps(result, indent=2) + "\n")
        (OUT / "dmesg.txt").write_text(subprocess.run(["dmesg"], check=False, capture_output=True, text=True).stdout)
        for f in ("agent.log", "doctor.txt"):
            if (RESULTS / f).exists():
                shutil.copy(RESULTS / f, OUT / f)
    return agent


def main():
    """The boot's steps, then each scenario with a reset before all but the first. A reset
    that fails ends the boot: the host reruns the scenarios left in a fresh one."""
    global OUT, PEER
    jobs = json.loads((JOB / "specs.json").read_text())
    spec = jobs[0]["spec"]
    RESULTS.mkdir(exist_ok=True)
    progress = open(RESULTS / "progress", "a")
    boot = {"boot_seconds": float(Path("/proc/uptime").read_text().split()[0])}
    try:
        install_project()
        load_modules(spec)
        doctor(spec)
        tunables = read_tunables()
        make_link(spec)
        if node_of(spec) > 1:
            PEER = nodes.Control(NODE_ADDR[1], timeout=900)
            step_clock()
        else:
            if spec.get("nodes", 1) > 1:
                PEER = nodes.Peer(NODE_ADDR[1])
            start_server(spec)   # the host gives a boot one export_fs
            if spec.get("agent_user"):      # and one agent user
                make_user(spec["agent_user"])
    except (ScenarioError, nodes.NodeError, OSError, subprocess.SubprocessError) as e:
        (RESULTS / "error.txt").write_text(f"{e}\n")
        log(f"FAILED before the first scenario: {e}")
        return 1
    finally:
        boot["guest_step_seconds"] = dict(timings)
        (RESULTS / "boot.json").write_text(json.dumps(boot, indent=2) + "\n")
    agent, rc = None, 0
    for i, job in enumerate(jobs):
        timings.clear()
        progress.write(f"start {job['name']}\n")
        progress.flush()
        log(f"scenario {job['name']} ({i + 1} of {len(jobs)})")
        OUT = RESULTS / job["name"]
        OUT.mkdir()
        if i:
            try:
                reset(tunables)
            except (ScenarioError, OSError, subprocess.SubprocessError) as e:
                (OUT / "error.txt").write_text(f"the reset before this scenario failed: {e}\n")
                log(f"reset failed, ending the boot: {e}")
                return 1
        agent = run_one({**job["spec"], "first": i == 0}, agent)
        rc = rc or (OUT / "error.txt").exists()
        progress.write(f"end {job['name']}\n")
        progress.flush()
    if agent:   # stopped as a user stops it (SIGINT): it must not hang on what the scenarios did
        timings.clear()
        try:
            agent.stop(120)
        except ScenarioError as e:
            log(f"the agent's stop failed: {e}")
            (OUT / "error.txt").write_text(f"the agent's stop after this, the boot's last scenario, failed: {e}\n")
            return 1
        finally:
            boot["agent_stop_seconds"] = timings.get("agent_stop")
            (RESULTS / "boot.json").write_text(json.dumps(boot, indent=2) + "\n")
    if isinstance(PEER, nodes.Peer):
        try:
            PEER.wait_hangup(300)
        except nodes.NodeError as e:
            log(f"node 2: {e}")
    log("scenarios done")
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
