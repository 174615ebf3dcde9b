"""Why an update failed, from the CLI's output (proxyinfra/autopilot/failure.py):
the two outputs below are the real CLI's (pulumi 3.274), trimmed, of two
autopilot updates that failed on this machine: a kvm provider's exception in
a create, and the program's (a manifest the partial run could not validate)."""

from __future__ import annotations

from proxyinfra.autopilot.failure import cli_error, failure_summary

PROVIDER_FAILED = """\
 code: 1
 stdout: Updating (auto):

    pulumi:pulumi:Stack egress-proxies-auto running read pulumi:pulumi:StackReference organization/egress-proxies/auto
 +  pulumi-python:dynamic:Resource home-4-overlay **creating failed** error: Traceback (most recent call last):
    pulumi:pulumi:Stack egress-proxies-auto running error: update failed
    pulumi:pulumi:Stack egress-proxies-auto **failed** 2 errors; 2 messages
Diagnostics:
  pulumi-python:dynamic:Resource (home-4-overlay):
    error: Traceback (most recent call last):
      File "/work/main/.venv/lib/python3.11/site-packages/pulumi/dynamic/__main__.py", line 170, in Create
        result = provider.create(props)
                 ^^^^^^^^^^^^^^^^^^^^^^
      File "/work/main/providers/kvm/overlay.py", line 203, in _check_base
        raise HostResourceMissing(
    providers.kvm.errors.HostResourceMissing: host 'nas1' (virt@192.0.2.1:22, provider 'home'): base image /var/lib/egress-proxies/simulated/default/egress-base-u2456ea58842833f.qcow2 is not a volume libvirt knows

  pulumi:pulumi:Stack (egress-proxies-auto):
    error: update failed
    error: Resource monitor has terminated, shutting down

    2026-12-05 18:31:36,628 WARNING kvm every kvm host is simulated by libvirt's test driver

Resources:
    + 2 created
    2 unchanged
    2 errored

Duration: 1s

 stderr:
"""

PROGRAM_FAILED = """\
 code: 1
 stdout: Updating (kube):
    pulumi:pulumi:Stack egress-proxies-kube running error: Program failed with an unhandled exception:
    pulumi:pulumi:Stack egress-proxies-kube **failed** 1 error
Diagnostics:
  pulumi:pulumi:Stack (egress-proxies-kube):
    error: Program failed with an unhandled exception:
    Traceback (most recent call last):
      File "/work/main/.venv/lib/python3.11/site-packages/pulumi/runtime/stack.py", line 211, in wait_for_rpcs
        await task
    pydantic_core._pydantic_core.ValidationError: 2 validation errors for Manifest
    proxies.0.zone
      Field required [type=missing, input_value={'auth': {'password': 'pw-sEcReT-1'}, 'host': '10.247.0.237'}, input_type=dict]
        For further information visit https://errors.pydantic.dev/2.14/v/missing
Resources:
    1 unchanged
    1 errored
Duration: 1s
 stderr:
"""


def test_a_provider_s_exception_is_named_by_its_resource_type_and_message() -> None:
    assert failure_summary(PROVIDER_FAILED) == (
        "home-4-overlay: HostResourceMissing: host 'nas1' (virt@192.0.2.1:22, provider 'home'): "
        "base image /var/lib/egress-proxies/simulated/default/egress-base-u2456ea58842833f.qcow2 "
        "is not a volume libvirt knows"
    )


def test_the_program_s_exception_is_its_first_line_and_nothing_of_what_follows() -> None:
    summary = failure_summary(PROGRAM_FAILED)
    assert summary == "egress-proxies-kube: ValidationError: 2 validation errors for Manifest"
    assert "pw-sEcReT-1" not in summary


def test_the_last_of_chained_tracebacks_names_the_exception() -> None:
    output = """\
Diagnostics:
  pulumi-python:dynamic:Resource (home-0-domain):
    error: Traceback (most recent call last):
      File "x.py", line 1, in f
    KeyError: 'first'

    During handling of the above exception, another exception occurred:

    Traceback (most recent call last):
      File "x.py", line 2, in g
    providers.kvm.errors.HostUnreachable: host 'nas1': connection refused
"""
    assert failure_summary(output) == (
        "home-0-domain: HostUnreachable: host 'nas1': connection refused"
    )


def test_plain_errors_are_kept_and_the_engine_s_echoes_dropped() -> None:
    output = """\
Diagnostics:
  kubernetes:apps/v1:Deployment (proxy-1):
    error: resource ep/proxy-1 was not successfully created by the Kubernetes API server

  pulumi:pulumi:Stack (egress-proxies-kube):
    error: update failed
"""
    assert failure_summary(output) == (
        "proxy-1: resource ep/proxy-1 was not successfully created by the Kubernetes API server"
    )


def test_without_diagnostics_the_last_lines_are_shown_in_one_bounded_line() -> None:
    output = "\n".join(f"line {i}" for i in range(10)) + "\n" + "x" * 1000
    summary = failure_summary(output)
    assert summary.startswith("line 5 | line 6 | line 7 | line 8 | line 9 | xxx")
    assert len(summary) == 300 and "\n" not in summary


# A command that failed before any update, as the Automation API's error shows it.
NO_STACK = """
 code: 6
 stdout: \n stderr: error: no stack named 'nosuch' found
"""


def test_a_command_that_failed_before_any_update_gives_the_cli_s_error() -> None:
    assert cli_error(NO_STACK) == "no stack named 'nosuch' found"
    # With no `error:` line, what an update's failure would give.
    assert cli_error(PROVIDER_FAILED.replace("error: ", "")) == failure_summary(
        PROVIDER_FAILED.replace("error: ", "")
    )
