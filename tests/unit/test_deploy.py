"""deploy/'s recipes for `slotscope watch`, each checked by the tool that would refuse it: the
systemd unit by systemd-analyze, the DaemonSet by the Kubernetes schema (kubernetes-validate
bundles it, so this runs offline); both command lines by slotscope's own parser."""
from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from slotscope.agent.metrics import parse_address
from slotscope.cli.main import parser, size

pytestmark = pytest.mark.unit

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "..", "deploy")
UNIT = os.path.join(DEPLOY, "slotscope-watch.service")
DAEMONSET = os.path.join(DEPLOY, "kubernetes", "daemonset.yaml")


def unit_text() -> str:
    with open(UNIT) as f:
        return f.read()


def service() -> configparser.SectionProxy:
    unit = configparser.ConfigParser(interpolation=None)
    unit.optionxform = str          # systemd's keys are case-sensitive
    unit.read_string(unit_text())
    return unit["Service"]


def watch_args(argv: list[str]):
    """argv (slotscope watch ...) as slotscope's parser reads it."""
    assert argv[0] == "slotscope"
    args = parser().parse_args(argv[1:])
    assert args.cmd == "watch"
    return args


def test_systemd_analyze_verifies_the_unit(tmp_path):
    """systemd-analyze verify says nothing of the unit: no unknown key, no bad value (it warns
    and exits 0 for those, so its output is what is checked). ExecStart names `slotscope`,
    which systemd looks up in /usr/local/bin and the like; here it is the venv's."""
    if shutil.which("systemd-analyze") is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is missing: dev.sh installs it (apt package systemd)")
        pytest.skip("no systemd-analyze (dev.sh installs the apt package systemd)")
    venv_slotscope = os.path.join(os.path.dirname(sys.executable), "slotscope")
    text, n = re.subn(r"^ExecStart=slotscope ", f"ExecStart={venv_slotscope} ", unit_text(), flags=re.M)
    assert n == 1
    rendered = tmp_path / "slotscope-watch.service"
    rendered.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(rendered)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_unit_limits_memory_and_cpu():
    s = service()
    assert size(s["MemoryHigh"]) < size(s["MemoryMax"])
    assert re.fullmatch(r"\d+%", s["CPUQuota"])
    assert s["LimitMEMLOCK"] == "infinity"


def test_the_units_command_line_is_a_watch_that_reloads_on_sighup():
    s = service()
    args = watch_args(shlex.split(s["ExecStart"]))
    assert args.out == f"/var/lib/{s['StateDirectory']}"
    parse_address(args.metrics)
    assert s["Type"] == "exec"          # watch sends no sd_notify
    assert s["ExecReload"] == "kill -HUP $MAINPID" and s["KillSignal"] == "SIGTERM"
    assert s["KillMode"] == "mixed"     # SIGTERM to watch alone: its incident's analysis is left to finish
    # watch waits up to 60 s for an incident's analysis when it stops (agent/watch.py STOP_WAIT)
    from slotscope.agent.watch import STOP_WAIT
    assert int(s["TimeoutStopSec"]) > STOP_WAIT


def daemonset_documents() -> list[dict]:
    with open(DAEMONSET) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def the_daemonset() -> dict:
    [ds] = [d for d in daemonset_documents() if d["kind"] == "DaemonSet"]
    return ds


def test_the_daemonset_is_valid_against_the_kubernetes_schema():
    """Strict: a misspelt or misplaced field fails, as kubectl's server-side validation would;
    against the oldest and the newest Kubernetes the package has schemas for."""
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions
    refused = []
    for version in (all_versions()[0], kubernetes_validate.latest_version()):
        for doc in daemonset_documents():
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:     # its str() holds the whole schema
                refused.append(f"{doc['kind']} against {version}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert refused == []


def test_the_daemonset_traces_the_host_and_serves_its_metrics():
    pod = the_daemonset()["spec"]["template"]
    spec = pod["spec"]
    [watch] = spec["containers"]
    assert spec["hostPID"] and watch["securityContext"]["privileged"]
    mounted = {m["name"]: m["mountPath"] for m in watch["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert {host[n] for n in mounted} >= {"/lib/modules", "/usr/src", "/sys/kernel/debug", "/sys/kernel/tracing"}
    assert all(mounted[n] == host[n] for n in mounted)          # at the host's own paths
    args = watch_args(watch["command"] + [a.replace("$(NODE_IP)", "10.0.0.1") for a in watch["args"]])
    assert args.out in mounted.values()
    _host, port = parse_address(args.metrics)
    [metrics] = watch["ports"]
    assert metrics["containerPort"] == port == int(pod["metadata"]["annotations"]["prometheus.io/port"])


def test_the_daemonset_has_the_units_limits():
    """One budget, whichever way watch is run."""
    limits, s = the_daemonset()["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"], service()
    assert size(limits["memory"].removesuffix("i")) == size(s["MemoryMax"])
    assert float(limits["cpu"]) == int(s["CPUQuota"].rstrip("%")) / 100
