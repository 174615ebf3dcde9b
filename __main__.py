"""Pulumi entry point: everything lives in proxyinfra.program."""

from proxyinfra.program import main

main()
