"""bench/overhead.py's figure: each agent block against the baseline blocks around it, so that
a drifting machine speed does not pass for the agent's cost, and an interval that decides."""
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location(
    "overhead", Path(__file__).resolve().parents[2] / "bench" / "overhead.py")
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)


def rounds(baselines, agent_factors, repeat=1):
    """Rows as summarize() builds them: baseline block K at baselines[K-1] bytes/s, agent block
    K at the midpoint of its neighbours times its factor (a machine speeding up linearly)."""
    rows = []
    for k, base in enumerate(baselines, 1):
        rows += [{"label": f"base-{k}.{j}", "agent": False, "bytes_per_s": base} for j in range(1, repeat + 1)]
        if k <= len(agent_factors):
            mid = (base + baselines[k]) / 2
            rows += [{"label": f"agent-{k}.{j}", "agent": True, "bytes_per_s": mid * agent_factors[k - 1]}
                     for j in range(1, repeat + 1)]
    return rows


def test_a_steady_drift_cancels():
    # Pooled means would give 0.95 * mean(110..170) / mean(100..180), not 0.95.
    ratios = overhead.block_ratios(rounds([100, 120, 140, 160, 180], [0.95] * 4, repeat=2))
    assert ratios == pytest.approx([0.95] * 4)


def test_the_interval_decides_only_when_it_excludes_the_goal():
    close = overhead.log_interval([0.99, 0.985, 0.995, 0.99])
    assert overhead.GOAL < close[0] < 0.99 < close[1]
    wide = overhead.log_interval([0.90, 1.05, 0.93, 1.02])
    assert wide[0] < overhead.GOAL < wide[1]
    assert overhead.log_interval([0.9]) is None


def test_a_round_is_whole_when_it_wrote_what_every_save_writes():
    """expected_bytes counts every save of the run: the warm-up, the measured rounds and
    the unmeasured save after each agent start."""
    from vmrig.scenario import expected_bytes
    spec = {"ranks": 2, "file_mb": 0.5, "files_per_rank": 1, "rank_overrides": {},
            "compare_agent": 2, "compare_repeat": 1, "export_fs": "tmpfs"}
    per_save = 2 * 2**19
    labels = [("base-1.1", False), ("agent-1.1", True), ("base-2.1", False), ("agent-2.1", True), ("base-3.1", False)]
    rounds = [{"label": label, "agent": agent, "bytes": per_save - (label == "base-2.1"), "wall_s": 1.0,
               "bytes_per_s": float(per_save), "usage": {"seconds": 1.0, "guest_busy_ns": 10**9}}
              for label, agent in labels]
    rec = {"spec": spec, "expected_bytes": expected_bytes(spec), "rounds": rounds, "options": {}, "kernel": "k",
           "accel": "tcg", "host_seconds": {"vm": 1}}
    assert rec["expected_bytes"] == 8 * per_save
    whole = {r["label"]: r["all_bytes"] for r in overhead.summarize(rec)["rounds"]}
    assert whole == {"base-1.1": True, "agent-1.1": True, "base-2.1": False, "agent-2.1": True, "base-3.1": True}


def test_programs_costliest_first_with_runs_per_rpc():
    runtime = {"tracepoint__sunrpc__rpc_stats_latency": {"run_cnt": 100, "run_ns": 50_000},
               "tracepoint__sunrpc__rpc_task_run_action": {"run_cnt": 1200, "run_ns": 300_000},
               "tracepoint__syscalls__sys_enter_openat": {"run_cnt": 0, "run_ns": 0}}
    progs = overhead.programs(runtime)
    assert [p["program"] for p in progs] == ["tracepoint__sunrpc__rpc_task_run_action",
                                             "tracepoint__sunrpc__rpc_stats_latency"]   # never run: left out
    assert progs[0]["runs_per_rpc"] == 12 and progs[0]["ns_per_run"] == 250
    assert progs[0]["share"] == pytest.approx(300 / 350, abs=1e-4)
    assert overhead.programs({"kprobe__xprt_reserve": {"run_cnt": 3, "run_ns": 30}})[0]["runs_per_rpc"] is None


def test_bpf_per_write_as_measured_and_net_of_the_statistics():
    """Per WRITE RPC: all programs' run time over the WRITEs; net of the statistics' own cost (an
    empty program's ns a run) on every run; in instructions on the instruction clock only."""
    runtime = {"tracepoint__nfs__nfs_initiate_write": {"run_cnt": 10, "run_ns": 2_000},
               "tracepoint__sunrpc__rpc_task_run_action": {"run_cnt": 140, "run_ns": 28_000}}
    w = overhead.per_write(runtime, 40.0, "icount shift=2")   # 150 runs of 40 ns over 10 WRITEs: 600 ns each
    assert w == {"writes": 10, "stats_cost_ns": 40.0, "ns": 3_000, "net_ns": 2_400,
                 "instructions": 750, "net_instructions": 600}
    assert overhead.per_write(runtime, None, "wall")["net_ns"] is None
    assert overhead.per_write(runtime, 50.0, "wall")["instructions"] is None
    assert overhead.per_write({"kprobe__xprt_reserve": {"run_cnt": 3, "run_ns": 30}}, 50.0, "wall") is None
    progs = overhead.programs(runtime, 40.0)
    assert [p["net_ns_per_run"] for p in progs] == [160, 160]


def test_qemu_runs_one_vcpu_on_the_instruction_clock():
    """icount: the guest clock counts instructions, on one vCPU (two hang at boot under icount)."""
    from vmrig.vm import CPUS, qemu_command

    class FakeImage:
        rootfs = Path("/img/rootfs.img")

        def kernel(self, _version):
            return Path("/img/vmlinuz"), Path("/img/initrd")

    def opt(cmd, name):
        return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == name]

    wall = qemu_command(FakeImage(), "6.1", "tcg", "/tmp/c", [])
    assert opt(wall, "-smp") == [str(CPUS)] and opt(wall, "-icount") == []
    counted = qemu_command(FakeImage(), "6.1", "tcg", "/tmp/c", [], icount=2)
    assert opt(counted, "-smp") == ["1"] and opt(counted, "-icount") == ["shift=2,sleep=off"]


def test_the_goal_is_issue_24s_for_the_agent_and_clock():
    assert overhead.goal("watch", "icount", 0) == 0.997 and overhead.goal("watch", "icount", 2) == 0.99
    assert overhead.goal("record", "icount", 2) == 0.985
    assert overhead.goal("record", "icount", 0) == overhead.goal("watch", "wall", 0) == overhead.GOAL


def test_the_benchs_watch_is_scraped_in_the_guest_and_a_scenarios_by_the_host():
    """--watch with --compare-agent (bench/overhead.py --agent watch) is accepted, and needs neither
    the metrics NIC nor the host's Prometheus, nor a boot of its own; a watched scenario has all three."""
    from vmrig.scenario import check, metrics_spec, own_boot, parser, spec_of

    def spec(*args):
        ap = parser()
        a = ap.parse_args(["--out", "/nonexistent", "--watch", *args])
        check(ap, a)
        return spec_of(a)
    bench, watched = spec("--compare-agent", "2"), spec()
    assert metrics_spec(bench) == {"metrics": "127.0.0.1:9465", "scrape_s": 15, "metrics_nic": False}
    assert not own_boot(bench)
    assert metrics_spec(watched)["metrics_nic"] and own_boot(watched)
    assert metrics_spec(spec_of(parser().parse_args(["--out", "/nonexistent"]))) == {}
