"""Host side of the VM rig: image build and cache, qemu control, scenarios."""
