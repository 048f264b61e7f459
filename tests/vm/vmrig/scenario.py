"""Host side of `run-scenario`: parse options, hand the job to a VM, collect results.

The guest half is tests/vm/guest/scenario.py; the two talk through spec.json (in) and
the out/ directory (back) of the 9p job share.
"""

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from . import mountstats
from .image import REPO, VM_DIR, BuildError, ensure_image
from .vm import Share, VMError, run_vm

MODES = ("buffered", "fsync", "osync", "odirect")
OVERRIDE_KEYS = {"write-size": ("write_size", int), "mode": ("mode", str), "file-mb": ("file_mb", float)}


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
            f"bad --rank-override {text!r}: want RANK:write-size=BYTES,mode=MODE[,file-mb=MB]") from None


def parser():
    ap = argparse.ArgumentParser(
        prog="run-scenario",
        description="Run one NFS checkpoint-storm scenario in the qemu VM and collect its results.")
    ap.add_argument("--out", required=True, type=Path, help="results directory (created)")
    ap.add_argument("--kernel", choices=("6.1", "6.12"), default="6.1")
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
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--write-size", type=int, default=1 << 20, help="bytes per write()")
    ap.add_argument("--mode", choices=MODES, default="buffered")
    ap.add_argument("--file-mb", type=float, default=8, help="size of each file a rank writes")
    ap.add_argument("--files-per-rank", type=int, default=1)
    ap.add_argument("--rank-override", type=rank_override, action="append", default=[],
                    metavar="RANK:write-size=BYTES,mode=MODE", help="per-rank settings (repeatable)")
    ap.add_argument("--server-freeze-at", type=float, metavar="S",
                    help="seconds after the writers start to make the server unreachable")
    ap.add_argument("--server-freeze-for", type=float, metavar="S", help="how long it stays unreachable")
    ap.add_argument("--agent-args", default="", help="extra arguments for `slotscope record`")
    ap.add_argument("--no-agent", action="store_true", help="run without the agent")
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
    ap.add_argument("--nfsd-threads", type=int, default=16)
    ap.add_argument("--export-fs", choices=("disk", "tmpfs"), default="disk",
                    help="what the server exports: a directory on the VM's ext4 disk (its syncs go "
                         "through the journal, whose timing varies under TCG), or a tmpfs")
    ap.add_argument("--icount", type=int, metavar="SHIFT",
                    help="under TCG, run the guest on an instruction-counting clock, one vCPU: each "
                         "emulated instruction is 2**SHIFT ns of guest time, so the host's speed and load do "
                         "not enter guest timings (bench/overhead.py; vmrig/vm.py icount_args)")
    ap.add_argument("--agent-start-timeout", type=float, default=240,
                    help="seconds to wait for the agent's 'recording' line (BCC compiles slowly under TCG)")
    ap.add_argument("--agent-stop-timeout", type=float, default=120)
    ap.add_argument("--writer-timeout", type=float, default=600,
                    help="writer deadline inside the VM; on expiry blocked tasks are dumped to hang.txt")
    ap.add_argument("--timeout", type=float, default=1200, help="hard limit for the whole VM run")
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
    for ev in a.ftrace:
        if ev.count(":") != 1 or "/" in ev or ".." in ev:
            ap.error(f"--ftrace {ev!r}: want SYSTEM:EVENT")
    for rank, _ in a.rank_override:
        if not 0 <= rank < a.ranks:
            ap.error(f"--rank-override: rank {rank} is not in 0..{a.ranks - 1}")


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
        "agent": not a.no_agent, "agent_args": a.agent_args.split(),
        "nfsd_threads": a.nfsd_threads, "agent_start_timeout": a.agent_start_timeout,
        "agent_stop_timeout": a.agent_stop_timeout, "writer_timeout": a.writer_timeout,
        "compare_agent": a.compare_agent,
        "compare_repeat": a.compare_repeat if a.compare_agent else None, "ftrace": a.ftrace, "export_fs": a.export_fs,
    }


def expected_bytes(spec):
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


def collect(share, out):
    """Move what the guest left in the share (even after a failure) into out."""
    for f in [*(share / "out").glob("*"), share / "job.log"]:
        if f.exists():
            shutil.move(f, out / f.name)
    shutil.rmtree(share, ignore_errors=True)


def run(a):
    """Run the scenario described by parsed options a; return the scenario record."""
    out = a.out.resolve()
    if out.exists() and any(out.iterdir()):
        raise ScenarioFailed(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    spec = spec_of(a)
    sources = source_key()  # before the run: the checkout may change meanwhile
    t0 = time.monotonic()
    image = ensure_image()
    image_seconds = round(time.monotonic() - t0, 1)
    share = out / ".job"
    shutil.copytree(VM_DIR / "guest", share / "guest")
    shutil.copy(VM_DIR / "guest/job.sh", share / "job")
    (share / "spec.json").write_text(json.dumps(spec, indent=2))
    try:
        res = run_vm(image, a.kernel, share, out / "console.log", a.timeout,
                     shares=[Share("src", REPO, readonly=True)], log=log, icount=a.icount)
    except VMError as e:
        raise ScenarioFailed(str(e)) from None
    finally:
        collect(share, out)
    guest_json = out / "guest.json"
    if not guest_json.exists():
        raise ScenarioFailed(f"the job in the VM exited ({res.rc}) without results; "
                             f"see {out}/job.log and console.log")
    guest = json.loads(guest_json.read_text())
    guest_json.unlink()
    record = {"options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
              "spec": spec, "image": image.manifest["key"], "source_key": sources, "accel": res.accel,
              "clock": res.clock,
              "kernel_abi": image.manifest["kernels"][a.kernel]["abi"],
              "host_seconds": {"image_check": image_seconds, "vm": res.seconds},
              "expected_bytes": expected_bytes(spec), **guest}
    (out / "scenario.json").write_text(json.dumps(record, indent=2) + "\n")
    if res.rc != 0:
        error = out / "error.txt"
        why = error.read_text().strip() if error.exists() else f"job exited with status {res.rc}"
        raise ScenarioFailed(f"scenario failed in the VM: {why}\n(see {out}/job.log and console.log)")
    if record["server_bytes"] != record["expected_bytes"]:
        raise ScenarioFailed(f"server has {record['server_bytes']} bytes, expected "
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


def main(argv=None):
    ap = parser()
    a = ap.parse_args(argv)
    check(ap, a)
    try:
        run(a)
    except (ScenarioFailed, BuildError) as e:
        log(f"FAILED: {e}")
        return 1
    log(f"results in {a.out}")
    print(summary(a.out.resolve()))
    return 0
