"""Errors a user can act on: each names the host, its address and what to check."""

from __future__ import annotations


class KvmError(Exception):
    """Base of every error of the kvm backend."""


class HostError(KvmError):
    def __init__(self, where: str, problem: str, fix: str) -> None:
        self.where = where
        self.problem = problem
        self.fix = fix
        super().__init__(f"{where}: {problem}; {fix}")


class HostUnreachable(HostError):
    pass


class AuthenticationRefused(HostError):
    pass


class HostKeyUnknown(HostError):
    pass


class HostKeyMismatch(HostError):
    pass


class KeyFileError(HostError):
    pass


class LibvirtSocketError(HostError):
    """Socket missing (libvirtd not running), permission denied, or forwarding refused."""


class LibvirtUnavailable(HostError):
    pass


class HostResourceMissing(HostError):
    """A pool, bridge or network the config names is not on the host."""


class CapacityError(HostError):
    """Not enough room on the host: names pool or memory, what is needed and what is there."""


class ImageError(KvmError):
    """A base image could not be fetched or did not match its digest."""


class InUseError(KvmError):
    """Deleting something that others still depend on."""
