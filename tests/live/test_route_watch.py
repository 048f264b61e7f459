"""The link sampler looks up the route to each NFS server again only when something it depends
on changed: a mount, a route, an address or a link (agent/samplers.py, RouteWatch)."""
import json
import os
import sys
import subprocess

import pytest

from slotscope.agent.samplers import RouteWatch

pytestmark = pytest.mark.live

TEST_NETS = ("198.51.100.0/24", "203.0.113.0/24")   # RFC 5737 documentation ranges


@pytest.fixture
def watch():
    if os.geteuid() != 0:
        pytest.skip("needs root (a route and a mount to change)")
    w = RouteWatch()
    yield w
    w.close()


def unused_test_net():
    for net in TEST_NETS:
        if not subprocess.run(["ip", "route", "show", net], capture_output=True, text=True, check=True).stdout:
            return net
    pytest.skip(f"{' and '.join(TEST_NETS)} are both routed here")


def test_a_route_change_is_seen_once(watch):
    net = unused_test_net()
    assert watch.changed()          # the first look: nothing known yet
    assert not watch.changed()
    subprocess.run(["ip", "route", "add", net, "dev", "lo"], check=True)
    try:
        assert watch.changed()
        assert not watch.changed()
    finally:
        subprocess.run(["ip", "route", "del", net, "dev", "lo"], check=True)
    assert watch.changed()


def test_a_mount_change_is_seen_once(watch, tmp_path):
    watch.changed()
    assert not watch.changed()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(tmp_path)], check=True)
    try:
        assert watch.changed()
        assert not watch.changed()
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)
    assert watch.changed()


def test_meta_names_the_links_of_the_agents_own_namespace():
    """meta.json's NICs are those of the agent's network namespace, with their speeds, even when
    /sys/class/net shows another (here: the host's, since unshare --net does not remount /sys)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace)")
    script = ("ip link add sst0 type veth peer name sst1 && "
              f"{sys.executable} -c 'import json; from slotscope.agent.meta import nics; print(json.dumps(nics()))'")
    out = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert {n["name"]: n["speed_mbps"] for n in json.loads(out)} == {"lo": None, "sst0": 10_000, "sst1": 10_000}
