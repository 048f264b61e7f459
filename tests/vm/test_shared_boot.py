"""Several scenarios in one boot (vmrig/scenario.py run_many, guest/scenario.py reset): each
starts as clean as on a fresh boot, and one that hangs does not take the others with it."""
import json

import pytest

from slotscope.capture.reader import Capture
from vmrig import mountstats
from vmrig.scenario import ScenarioFailed, expected_bytes, parser, run_many, spec_of

pytestmark = pytest.mark.vm
MiB = 2**20


def _record(out):
    return json.loads((out / "scenario.json").read_text())


@pytest.mark.parametrize("mixed,unconstrained", [("6.1", "6.1"), ("6.12", "6.12")], indirect=True)
def test_a_scenario_after_a_reset_has_nothing_of_the_one_before(mixed, unconstrained):
    """mixed (a 2-slot NFSv3 table) then unconstrained (no limit) in one boot: the second has
    a fresh mount (counters from zero), the boot's slot limit back (its transport grows past
    2 slots), only its own files on the server and only its own ranks in its capture."""
    first, second = _record(mixed), _record(unconstrained)
    assert first["boot"]["id"] == second["boot"]["id"]
    order = second["boot"]["scenarios"]
    assert order.index(mixed.name) < order.index(unconstrained.name)
    before = mountstats.parse((unconstrained / "mountstats.before").read_text())
    assert before["ops"]["WRITE"]["ops"] == 0 and before["bytes"]["server_write"] == 0
    sysctls = [Capture.open(str(out / "capture")).meta["sunrpc"]["tcp_max_slot_table_entries"]
               for out in (mixed, unconstrained)]
    assert sysctls[0] == "2" and int(sysctls[1]) > 2, sysctls
    after = [mountstats.parse((out / "mountstats.after").read_text())["xprt"] for out in (mixed, unconstrained)]
    assert max(x["max_slots"] for x in after[0]) <= 2 < max(x["max_slots"] for x in after[1]), after
    assert second["server_files"] == {f"rank{r:04d}/shard0.bin": 4 * MiB for r in range(4)}
    procs = Capture.open(str(unconstrained / "capture")).read("procs").to_pylist()
    ranked = {p["tgid"] for p in procs if p["rank"] is not None}
    assert ranked == {r["pid"] for r in second["ranks"]}
    assert not ranked & {r["pid"] for r in first["ranks"]}


def _spec(*args):
    return spec_of(parser().parse_args(["--out", "x", "--nfs-vers", "3", "--no-agent", *args]))


def test_a_hung_scenario_is_killed_and_the_rest_rerun_in_a_fresh_boot(vm_image, tmp_path):
    """The middle scenario's server never comes back (a hard mount: its writer sleeps in the
    kernel for good, past its own deadline): the host kills the VM after the scenario budget,
    names the scenario, keeps the console; the scenario after it runs in a second boot."""
    ok = _spec("--ranks", "2", "--write-size", "65536", "--mode", "fsync", "--file-mb", "0.25")
    hang = _spec("--ranks", "1", "--write-size", "4096", "--mode", "osync", "--file-mb", "0.25",
                 "--server-freeze-at", "0.5", "--server-freeze-for", "100000", "--writer-timeout", "100000")
    res = run_many([("before", ok, tmp_path / "before"), ("hang", hang, tmp_path / "hang"),
                    ("after", ok, tmp_path / "after")], "6.1", None, scenario_budget=30)
    assert isinstance(res["hang"], ScenarioFailed)
    assert "scenario hang hung: still running after 30 s" in str(res["hang"])
    assert "vminit: running /job/job" in (tmp_path / "hang" / "console.log").read_text()
    assert "Console" in str(res["hang"])       # with the console's last lines
    for name in ("before", "after"):
        assert not isinstance(res[name], Exception), res[name]
        assert res[name]["server_bytes"] == expected_bytes(ok) == 2 * MiB // 4
    assert res["before"]["boot"]["id"] != res["after"]["boot"]["id"]
    assert res["after"]["boot"]["scenarios"] == ["after"]
