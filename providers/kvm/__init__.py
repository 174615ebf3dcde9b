"""The kvm backend: libvirt hosts reached over SSH only."""
