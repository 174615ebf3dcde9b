"""The clouds under Pulumi mocks: a new-resource hook for `run_program` that
gives resources the outputs the real providers would add, and the public
image families the gcp configs of the tests name.

The hook stands in for the clouds: it gives instances and addresses their
external IPs, LoadBalancer Services their ingress, ClusterIP Services
their cluster IP, and the credentials (a
dynamic resource that is not run under mocks) a password with its real
bcrypt hash. It runs in the program's process, imported by name (HOOK).
"""

from __future__ import annotations

import hashlib
from typing import Any

import bcrypt
from pulumi.runtime.mocks import MockResourceArgs

HOOK = "tests.support.mock_clouds:mock_resource"
DYNAMIC = "pulumi-python:dynamic:Resource"
INSTANCE = "gcp:compute/instance:Instance"
ADDRESS = "gcp:compute/address:Address"
SERVICE = "kubernetes:core/v1:Service"
SECRET = "kubernetes:core/v1:Secret"
DEBIAN = "projects/debian-cloud/global/images/family/debian-12"
UBUNTU = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"


def _ip(prefix: str, name: str) -> str:
    return f"{prefix}.{int(hashlib.sha256(name.encode()).hexdigest()[:4], 16) % 250 + 2}"


def mock_resource(args: MockResourceArgs) -> tuple[str, dict[str, Any]] | None:
    """Outputs the real providers would add (runs in the program's process)."""
    outputs = dict(args.inputs)
    if args.typ == DYNAMIC and args.name.startswith("discovery-"):  # GeneratedSecret
        outputs["value"] = "generated-" + hashlib.sha256(args.name.encode()).hexdigest()[:24]
    elif args.typ == SECRET and args.resource_id:  # Secret.get of an existing Secret
        outputs = {"data": {"token": "ZXhpc3RpbmctdG9rZW4tMDEyMzQ1Njc4OQ=="}}
        return args.resource_id, outputs
    elif args.typ == DYNAMIC and args.name.endswith("-credentials"):
        password = "pw-" + hashlib.sha256(args.name.encode()).hexdigest()[:16]
        digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        outputs.update(password=password, password_hash=digest)
    elif args.typ == DYNAMIC:  # kvm's BaseImage, Overlay, SeedIso, ProxyDomain
        outputs.update(path=f"/pool/{args.name}", volume=args.name, sha256="0" * 64)
        outputs.update(ip=_ip("192.168.1", args.name))
    elif args.typ == ADDRESS:
        outputs["address"] = _ip("203.0.113", args.name)
    elif args.typ == INSTANCE:
        for nic in outputs.get("networkInterfaces", []):
            for config in nic.get("accessConfigs", []):
                config.setdefault("natIp", _ip("198.51.100", args.name))
    elif args.typ == SERVICE and outputs["spec"]["type"] == "LoadBalancer":
        outputs["status"] = {"loadBalancer": {"ingress": [{"ip": _ip("192.0.2", args.name)}]}}
    elif args.typ == SERVICE:  # ClusterIP: the address the API server allocates
        outputs["spec"] = {**outputs["spec"], "clusterIP": _ip("10.96.0", args.name)}
        if outputs["spec"]["type"] == "NodePort":  # and node ports from 30000 on
            ports = outputs["spec"]["ports"]
            outputs["spec"]["ports"] = [{**p, "nodePort": 30000 + i} for i, p in enumerate(ports)]
    else:
        return None
    return f"{args.name}-id", outputs
