"""The live tier: root and BCC on this machine's own kernel.

Not root: skipped (the quick tier). Root but the probes cannot load: that is a
failure, not a skip, so CI cannot pass by skipping everything."""
import os

import pytest


@pytest.fixture(scope="session")
def bpf_ready():
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF)")
    from slotscope.agent.probes import SyscallProbes
    reason = SyscallProbes().can_run()
    assert reason is None, f"running as root but the syscall probes cannot load: {reason}"
