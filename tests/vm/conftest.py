"""Fixtures for the VM tier: the image is built (or found in the cache) once per session,
and so is each named scenario, so every test file can use the same runs.

Each scenario fixture returns the results directory of one scenario (see README.md,
"Reading the results"): scenario.json, mountstats.*, capture/, ... The first test that
needs a scenario runs it together with every other scenario the collected tests need on
the same kernel and clock, in shared boots (README.md, "The plan"); the instruction-clock boots
start at collection, on idle CPU time beside the unit and live tiers (_background).

SLOTSCOPE_VM_RESULTS=DIR keeps the results in DIR/<scenario name> and reuses a stored
run whose options and checkout sources (agent, bpf, guest scripts: `source_key` in
scenario.json) are the same as now, instead of booting a VM again; a stored run that
differs is replaced. Without it, runs go to pytest's temporary directory.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

VM_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(VM_DIR))
from vmrig import mountstats  # noqa: E402
from vmrig.image import CACHE_ROOT, KERNELS, cache_key, ensure_image  # noqa: E402
from vmrig.scenario import expected_bytes, log, parser, run_many, source_key, spec_of  # noqa: E402
from vmrig.scenarios import NAMED  # noqa: E402
from vmrig.vm import STOP, choose_accel  # noqa: E402


@pytest.fixture(scope="session")
def vm_image():
    if os.geteuid() != 0:
        pytest.skip("the VM rig needs root (debootstrap, chroot, loop-free mkfs)")
    missing = [t for t in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4") if not shutil.which(t)]
    if missing:
        pytest.skip(f"the VM rig needs {', '.join(missing)} (apt-get install qemu-system-x86 debootstrap)")
    return ensure_image()


def _reusable(out, spec):
    """A stored, successful run of the same options made from the same sources."""
    rec = _read_json(out / "scenario.json")
    return bool(rec and rec.get("spec") == spec and rec.get("source_key") == source_key()
                and rec.get("server_bytes") == expected_bytes(spec, rec.get("ranks", ())) and not (out / "error.txt").exists()
                and (not spec["agent"] or (out / ("prometheus" if spec.get("watch") else "capture/meta.json")).exists()))


def _read_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# Each scenario this session used: (label, results directory, reused), for the time summary.
RUNS: list[tuple[str, Path, bool]] = []
# (scenario, kernel) -> its results directory, or the failure; and those the collected tests use.
RESULTS: dict[tuple[str, str], Path | Exception] = {}
NEEDED: set[tuple[str, str]] = set()


def pytest_collection_finish(session):
    """The scenarios the selected tests use (after -k and -m deselection); the images they boot
    start building in the background."""
    vm_items = [item for item in session.items if item.get_closest_marker("vm")]
    for item in vm_items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for name in item.fixturenames:
            if name in NAMED:
                NEEDED.add((name, params.get(name, "6.1")))
    if vm_items:
        _prebuild(["6.1", *sorted({k for _, k in NEEDED} - {"6.1"}, key=list(KERNELS).index)])
        _background(session.config)


PREBUILD: list[subprocess.Popen] = []


def _prebuild(kernels):
    """The images of `kernels` not in the cache, built one after another at the lowest priority
    while the unit and live tiers run (conftest.py runs them first): from scratch both roots took
    7.4 min here, the unit tier 7. ensure_image waits for a build under way (its lock) and builds
    what this one did not; the log is CACHE_ROOT/prebuild.log."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("qemu-system-x86_64", "debootstrap", "ionice")):
        return      # vm_image says why
    roots = {}
    for k in kernels:
        roots.setdefault(KERNELS[k], k)
    missing = [k for root, k in roots.items() if not (CACHE_ROOT / cache_key(root)).is_dir()]
    if not missing:
        return
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    script = 'py=$1 build=$2; shift 2; for k; do nice -n 19 ionice -c 3 "$py" "$build" --kernel "$k" || exit; done'
    with open(CACHE_ROOT / "prebuild.log", "w") as out:
        PREBUILD.append(subprocess.Popen(["sh", "-c", script, "sh", sys.executable, str(VM_DIR / "build-image"),
                                          *missing], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True))


# The instruction-clock boots, run beside the unit and live tiers (_background).
BACKGROUND: list[threading.Thread] = []
IDLE_BUDGET = 2 * 900.0     # a boot on idle CPU time beside the live tier: twice run_many's budgets


def _background(config):
    """Every instruction-clock boot the selected tests need starts now, after the images are built,
    in a thread, its VMs on idle CPU time (SCHED_IDLE) while the unit and live tiers run: a guest's
    times count its instructions, not the host's load (README.md, "Accelerator"), and the tiers
    before the VM tier leave a core idle most of the time. A test that needs one of them waits for
    the thread; what it did not run (a failure before the boots, KVM, which has no instruction
    clock) its fixture runs as before. Its log: vm-background.log in pytest's temporary directory."""
    keys = sorted((n, k) for n, k in NEEDED if _icount(n) is not None)
    if os.geteuid() != 0 or not keys or not all(shutil.which(t) for t in ("qemu-system-x86_64", "chrt")):
        return
    factory = config._tmp_path_factory      # the tmp_path_factory fixture's, before any fixture runs
    path = factory.getbasetemp() / "vm-background.log"

    def run():
        with open(path, "w", buffering=1) as out:
            def say(msg):
                print(f"{time.strftime('%H:%M:%S')} {msg}", file=out)
            for proc in PREBUILD:
                proc.wait()
            if STOP.is_set():
                return
            try:
                if choose_accel(ensure_image(kernel=keys[0][1]), keys[0][1]) != "tcg":
                    return say("no instruction clock with KVM: the fixtures run these boots")
                _run_boots(keys[0], factory, idle=True, say=say)
            except Exception as e:     # the fixtures run what is missing and meet the failure there
                say(f"stopped: {e!r}")
    BACKGROUND.append(threading.Thread(target=run, name="vm-background", daemon=True))
    BACKGROUND[0].start()


def pytest_sessionfinish(session):
    """The background boots are stopped (their VMs killed), and a build still running when the
    session ends early (-x, Ctrl-C) is stopped with it (SIGTERM: build-image removes its stage)."""
    STOP.set()
    for thread in BACKGROUND:
        thread.join()
    for proc in PREBUILD:
        if proc.poll() is not None:
            continue
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()             # the shell ends at once (reaped: a zombie stays in the group)
        end = time.monotonic() + 60
        try:
            while True:         # the build cleans up, then the group is empty
                os.killpg(proc.pid, signal.SIGKILL if time.monotonic() > end else 0)
                time.sleep(0.2)
        except ProcessLookupError:
            pass


def _label(name, kernel):
    return name if kernel == "6.1" else f"{name}-{kernel}"   # 6.1: the rig's default


def _spec(name, out):
    return spec_of(parser().parse_args(["--out", str(out), *NAMED[name]]))


def _run_boots(key, tmp_path_factory, idle=False, say=log):
    """Run the scenario `key` and every other one the session needs on its kernel and clock, in
    the order of NAMED, in shared boots (vmrig.scenario.run_many); stored runs are reused (see
    above). On the instruction clock, the boots of every kernel the session needs run now, as
    many at once as the host has cores: a guest's times count its instructions, not the host's
    load, and TCG with -icount is one host thread. Wall-clock boots run one at a time (their
    times are the host's). idle, say: the VMs on idle CPU time (with longer budgets), the log."""
    name, kernel = key
    icount = _icount(name)
    wanted = {key} | {(n, k) for n, k in NEEDED if (n, k) not in RESULTS and _icount(n) == icount
                      and (k == kernel or icount is not None)}
    keep = os.environ.get("SLOTSCOPE_VM_RESULTS")
    root = Path(keep) if keep else tmp_path_factory.mktemp("vm")
    todo, keys = {}, {}     # kernel -> [(label, spec, out)] in the order of NAMED; label -> (name, kernel)
    for k in KERNELS:
        for n in NAMED:
            if (n, k) in wanted and (run := _todo(n, k, root, keep)):
                todo.setdefault(k, []).append(run)
                keys[run[0]] = (n, k)
    for k in todo:
        ensure_image(kernel=k)      # one at a time: a build is not to be raced
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        budgets = {"scenario_budget": IDLE_BUDGET, "boot_budget": IDLE_BUDGET} if idle else {}
        done = dict(zip(todo, pool.map(lambda k: run_many(todo[k], k, icount, log=lambda msg: say(f"{k}: {msg}"),
                                                          idle=idle, **budgets), todo)))
    for k, runs in todo.items():
        for label, _, out in runs:
            if label in done[k]:
                RUNS.append((label, out, False))
                RESULTS[keys[label]] = done[k][label] if isinstance(done[k][label], Exception) else out


def _todo(name, kernel, root, keep):
    """(label, spec, out) for running the scenario, or None where a stored run is reused."""
    label = _label(name, kernel)
    out = root / label
    spec = _spec(name, out)
    if keep and _reusable(out, spec):
        RUNS.append((label, out, True))
        RESULTS[(name, kernel)] = out
        return None
    if out.exists():
        if not (out / "scenario.json").exists() and not (out / "console.log").exists():
            pytest.fail(f"{out} exists and does not look like scenario results: not replacing it")
        shutil.rmtree(out)
    return label, spec, out


def _icount(name):
    return parser().parse_args(["--out", "x", *NAMED[name]]).icount


def pytest_terminal_summary(terminalreporter):
    """The VM tier's time: each boot on the host's clock, and within it the guest's boot and
    install and each scenario's steps (on the guest's clock: the instruction clock with --icount)."""
    if not RUNS:
        return
    w = terminalreporter
    w.section("VM scenario times (s)")
    w.line(f"{'scenario':<22} {'clock':<14} {'boot id':<28} {'reset':>5} {'agent':>6} {'writers':>7} {'stop':>5}")
    boots = {}
    for label, out, reused in RUNS:
        rec = _read_json(out / "scenario.json")
        if rec is None:
            w.line(f"{label:<22} (no scenario.json)")
            continue
        steps, boot = rec.get("guest_step_seconds", {}), rec.get("boot", {})
        if not reused:
            boots[boot.get("id")] = boot
        w.line(f"{label:<22} {rec.get('clock', 'wall'):<14} {boot.get('id', '?'):<28} "
               f"{steps.get('reset', 0):>5.0f} {steps.get('agent_start', 0):>6.0f} "
               f"{steps.get('writers', 0):>7.0f} {steps.get('agent_stop', 0):>5.0f}" + ("  (reused)" if reused else ""))
    for bid, boot in boots.items():
        steps = boot.get("guest_step_seconds", {})
        w.line(f"boot {bid}: VM {boot.get('vm_seconds', 0):.0f} s, guest boot {boot.get('boot_seconds', 0):.0f} s, "
               f"install {steps.get('install_project', 0):.0f} s, {len(boot.get('scenarios', []))} scenarios")
    total = sum(b.get("vm_seconds", 0) for b in boots.values())
    w.line(f"{len(RUNS)} scenario runs in {len(boots)} boots, {total:.0f} s of VMs booted this session")
    _kernel_table(w)


def _kernel_table(w):
    """Per kernel, from its mixed scenario: each probe group's attach points (attached of
    expected) and fallbacks, and the capture's per-procedure sums against mountstats
    (tests/vm/README.md's kernel table comes from here)."""
    runs = sorted(((k, out) for (name, k), out in RESULTS.items() if name == "mixed" and isinstance(out, Path)),
                  key=lambda run: list(KERNELS).index(run[0]))
    if not runs:
        return
    w.section("VM kernels: what attached, and mixed against mountstats")
    for kernel, out in runs:
        capture = _read_json(out / "capture" / "meta.json") or {}
        probes = capture.get("probes", {})
        groups = probes.get("attach_plan", {}).get("groups", {})
        w.line(f"{kernel} ({capture.get('kernel', '?')}): " + "; ".join(
            f"{name} {g['attached']}/{g['expected']}" + (" fell back" if name in probes.get("fell_back", {}) else "")
            for name, g in groups.items()) + "".join(f"; {name} skipped" for name in probes.get("skipped", {})))
        try:
            fid = mountstats.fidelity(out)
        except (OSError, ValueError) as e:
            w.line(f"  no comparison: {e}")
            continue
        write = fid["procs"].get("WRITE")
        if write:
            w.line("  WRITE ours/mountstats: " + ", ".join(
                f"{key} {ours if key == 'ops' else round(ours or 0, 1)}/{theirs}" for key, (ours, theirs) in write.items()))
        equal = sum(p["ops"][0] == p["ops"][1] for p in fid["procs"].values())
        w.line(f"  {equal} of {len(fid['procs'])} procedures' counts equal; largest summed-time difference "
               f"{100 * mountstats.worst_sum_error(fid):.2f}% (beyond mountstats' 1 ms rounding); WRITE bytes "
               f"{fid['write_bytes'][0]}/{fid['write_bytes'][1]}")


# --- the scenarios (options and what each shows: vmrig/scenarios.py); scenarios on one kernel
# and clock share boots

def _named(name, kernels=("6.1",)):
    """A session fixture giving the named scenario's results, once per kernel (tests using it
    run on each). A real-client scenario skips on a kernel whose image has no clients (no CPU
    build of torch for its Python)."""
    @pytest.fixture(scope="session", name=name, params=kernels)
    def fixture(request, vm_image, tmp_path_factory):
        key = (name, request.param)
        missing = _spec(name, "x")["clients"] and ensure_image(kernel=request.param).manifest["clients"].get("missing")
        if missing:
            pytest.skip(f"no real checkpoint clients in the image of kernel {request.param}: {missing}")
        if key not in RESULTS and _icount(name) is not None:
            for thread in BACKGROUND:
                thread.join()
        if key not in RESULTS:
            _run_boots(key, tmp_path_factory)
        result = RESULTS[key]
        if isinstance(result, Exception):
            pytest.fail(str(result))
        return result
    fixture.__doc__ = f"Results directory of the {name!r} scenario, on kernels {', '.join(kernels)}."
    return fixture


def _kernels(variable, default):
    """The kernels a group of scenarios runs on: the environment variable, comma-separated (any
    of vmrig/image.py KERNELS), else the default (README.md, "The plan": a kernel costs a boot
    per clock)."""
    chosen = tuple(k for k in os.environ.get(variable, default).split(",") if k)
    unknown = [k for k in chosen if k not in KERNELS]
    if unknown:
        raise pytest.UsageError(f"{variable}: unknown kernel {', '.join(unknown)} "
                                f"(known: {', '.join(KERNELS)})")
    return chosen


# On each kernel of SLOTSCOPE_VM_KERNELS (by default all four): the probe groups load and attach
# what they planned, the per-procedure figures match mountstats (mixed), the slot table saturates
# (saturated). The other probe scenarios on 6.1 and 6.12 of those (SLOTSCOPE_VM_MORE_KERNELS: any
# kernels); the analyzer's causes on 6.1. One boot a kernel, on the instruction clock, two kernels
# at once (README.md, "The plan").
EVERY = _kernels("SLOTSCOPE_VM_KERNELS", ",".join(KERNELS))
BOTH = _kernels("SLOTSCOPE_VM_MORE_KERNELS", ",".join(k for k in ("6.1", "6.12") if k in EVERY))
mixed = _named("mixed", EVERY)
saturated = _named("saturated", EVERY)
saturated_v42 = _named("saturated_v42", BOTH)
unconstrained = _named("unconstrained", BOTH)
frozen = _named("frozen", BOTH)
small_sync = _named("small_sync")
flush_stall = _named("flush_stall")
straggler = _named("straggler")
nconnect = _named("nconnect")
# The AFTERs of what-if pairs whose BEFOREs are saturated and saturated_v42 (test_whatif_pairs.py).
slots16 = _named("slots16")
local_copy = _named("local_copy")
session32 = _named("session32")
v42_nconnect4 = _named("v42_nconnect4")
# ... and two pairs of their own, where more slots must buy little: a link-bound and a server-bound save
link_bound, link_bound16 = _named("link_bound"), _named("link_bound16")
server_bound, server_bound16 = _named("server_bound"), _named("server_bound16")
# Real checkpoint libraries (test_clients.py), by default on 6.1 only: what they add to the probe
# scenarios above is the libraries' file calls, the same on every kernel, and a job costs 2-3 min
# of VM a kernel (SLOTSCOPE_VM_CLIENT_KERNELS=6.1,6.12 runs them on both).
CLIENT_KERNELS = _kernels("SLOTSCOPE_VM_CLIENT_KERNELS", "6.1")
clients_healthy = _named("clients_healthy")
clients_saturated = _named("clients_saturated", CLIENT_KERNELS)
# An ordinary user's sampled agent on the scenarios whose BPF verdicts it must match (test_no_root.py).
saturated_sampled = _named("saturated_sampled")
frozen_sampled = _named("frozen_sampled")
flush_stall_sampled = _named("flush_stall_sampled")
unconstrained_sampled = _named("unconstrained_sampled")
# One torchrun job over two nodes, a pair of VMs (test_two_nodes.py).
two_nodes = _named("two_nodes")
# `slotscope watch` across a saturating storm and a healthy save, Prometheus on the host scraping it
# (test_watch_vm.py): a boot of its own.
watched = _named("watched")
