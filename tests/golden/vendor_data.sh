#!/bin/sh
# egress-proxies vendor-data: the QEMU guest agent lets the libvirt host read
# this VM's addresses (virsh domifaddr --source agent).
set -eu
if ! dpkg-query -W -f '${Status}' qemu-guest-agent 2>/dev/null | grep -q 'install ok installed'
then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-guest-agent
fi
# The unit is started by udev when the agent's virtio channel exists; without
# that channel it cannot run, which must not fail the whole boot.
systemctl start qemu-guest-agent || echo "qemu-guest-agent not started (no channel?)" >&2
