"""Fixtures for the VM tier: the image is built (or found in the cache) once per session,
and so is each named scenario, so every test file can use the same runs.

Each scenario fixture returns the results directory of one `run-scenario` (see
README.md, "Reading the results"): scenario.json, mountstats.*, capture/, ...

SLOTSCOPE_VM_RESULTS=DIR keeps the results in DIR/<scenario name> and reuses a stored
run whose options and checkout sources (agent, bpf, guest scripts: `source_key` in
scenario.json) are the same as now, instead of booting a VM again; a stored run that
differs is replaced. Without it, runs go to pytest's temporary directory.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VM_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(VM_DIR))
from vmrig.image import ensure_image  # noqa: E402
from vmrig.scenario import expected_bytes, parser, source_key, spec_of  # noqa: E402
from vmrig.scenarios import NAMED  # noqa: E402


@pytest.fixture(scope="session")
def vm_image():
    if os.geteuid() != 0:
        pytest.skip("the VM rig needs root (debootstrap, chroot, loop-free mkfs)")
    missing = [t for t in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4") if not shutil.which(t)]
    if missing:
        pytest.skip(f"the VM rig needs {', '.join(missing)} (apt-get install qemu-system-x86 debootstrap)")
    return ensure_image()


def _reusable(out, args):
    """A stored, successful run of the same options made from the same sources."""
    try:
        rec = json.loads((out / "scenario.json").read_text())
    except (OSError, ValueError):
        return False
    spec = spec_of(parser().parse_args(["--out", str(out), *args]))
    return (rec.get("spec") == spec and rec.get("source_key") == source_key()
            and rec.get("server_bytes") == expected_bytes(spec) and not (out / "error.txt").exists()
            and (not spec["agent"] or (out / "capture" / "meta.json").exists()))


# Each scenario this session used: (name, results directory, reused), for the time summary.
RUNS: list[tuple[str, Path, bool]] = []


def scenario(tmp_path_factory, name, *args):
    """Run one scenario (or reuse a stored run, see above); returns its results directory."""
    args = [str(a) for a in args]
    keep = os.environ.get("SLOTSCOPE_VM_RESULTS")
    if keep:
        out = Path(keep) / name
        if _reusable(out, args):
            RUNS.append((name, out, True))
            return out
        if out.exists():
            if not (out / "scenario.json").exists() and not (out / "console.log").exists():
                pytest.fail(f"{out} exists and does not look like scenario results: not replacing it")
            shutil.rmtree(out)
    else:
        out = tmp_path_factory.mktemp(name) / "s"
    p = subprocess.run([sys.executable, str(VM_DIR / "run-scenario"), "--out", str(out), *args],
                       capture_output=True, text=True, timeout=1500, check=False)
    RUNS.append((name, out, False))
    assert p.returncode == 0, p.stderr
    return out


def pytest_terminal_summary(terminalreporter):
    """The VM tier's time, per scenario run: the VM as a whole on the host's clock, and within
    it the guest's boot and steps (on the guest's clock: the instruction clock with --icount)."""
    if not RUNS:
        return
    w = terminalreporter
    w.section("VM scenario times (s)")
    w.line(f"{'scenario':<22} {'clock':<14} {'vm':>6} {'boot':>5} {'install':>7} {'agent':>6} {'writers':>7} {'stop':>5}")
    total = 0.0
    for name, out, reused in RUNS:
        try:
            rec = json.loads((out / "scenario.json").read_text())
        except (OSError, ValueError):
            w.line(f"{name:<22} (no scenario.json)")
            continue
        steps = rec.get("guest_step_seconds", {})
        vm = rec["host_seconds"]["vm"]
        total += 0 if reused else vm
        w.line(f"{name:<22} {rec.get('clock', 'wall'):<14} {vm:>6.0f} {rec.get('boot_seconds', 0):>5.0f} "
               f"{steps.get('install_project', 0):>7.0f} {steps.get('agent_start', 0):>6.0f} "
               f"{steps.get('writers', 0):>7.0f} {steps.get('agent_stop', 0):>5.0f}" + ("  (reused)" if reused else ""))
    w.line(f"{len(RUNS)} scenario runs, {total:.0f} s of VMs booted this session")


# --- the scenarios (options and what each shows: vmrig/scenarios.py), one VM run each

def _named(name, kernels=("6.1",)):
    """A session fixture running the named scenario once per kernel (tests using it run on each)."""
    @pytest.fixture(scope="session", name=name, params=kernels)
    def fixture(request, vm_image, tmp_path_factory):
        kernel = request.param
        if kernel == "6.1":            # the rig's default
            return scenario(tmp_path_factory, name, *NAMED[name])
        return scenario(tmp_path_factory, f"{name}-{kernel}", *NAMED[name], "--kernel", kernel)
    fixture.__doc__ = f"Results directory of the {name!r} scenario, on kernels {', '.join(kernels)}."
    return fixture


# The agent's probes on both kernels of the rig; the analyzer's causes on 6.1.
BOTH = ("6.1", "6.12")
mixed = _named("mixed", BOTH)
saturated = _named("saturated", BOTH)
saturated_v42 = _named("saturated_v42", BOTH)
unconstrained = _named("unconstrained", BOTH)
frozen = _named("frozen", BOTH)
small_sync = _named("small_sync")
flush_stall = _named("flush_stall")
straggler = _named("straggler")
nconnect = _named("nconnect")
