"""The program's resources register with a short stack trace.

With every registration the Python SDK sends the engine the frames of the
program's stack below the resource's constructor
(pulumi.runtime.resource._get_stack_trace), and the engine keeps them in the
state: the program's frames, then the language host's and asyncio's under
them, some 18 frames or 1.4 to 1.6 KiB per resource, 6 KiB per kvm proxy.
Neither has a setting for it (SDK 3.272 sends every frame; CLI 3.274 stores
every frame it gets: docs/architecture.md, decision log). The SDK takes the
frames with traceback.extract_stack(), which keeps only the innermost
``sys.tracebacklimit`` frames when that is set: registration runs with it
set to the SDK's own frames plus KEPT, so the state keeps one frame and
nothing below: the line of a kvm resource's class that registers it, or for
the Proxy component the line of the program that made it (a component's own
constructor is among the frames the SDK drops). The URN names the resource;
the caller's frame of a kvm resource (providers/kvm/deploy.py) is left out
too, 80 bytes a resource (docs/kvm-provider.md, "State per proxy").
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

# From extract_stack's caller to the third constructor up (which the SDK
# drops with the frames above it), innermost first: _get_stack_trace,
# register_resource, Resource.__init__, then CustomResource.__init__ and
# dynamic.Resource.__init__, or ComponentResource.__init__ and the
# component's own (SDK 3.272). tests/engine/test_cli_state_size.py fails
# if a new SDK counts otherwise.
SDK_FRAMES = 5
KEPT = 1


@contextmanager
def short_stack_trace() -> Iterator[None]:
    """Within: a stack trace is the innermost SDK_FRAMES + KEPT frames. Set
    only around a constructor's registration (the program registers on one
    thread) and restored on the way out, an error's included, so nothing
    else prints shorter tracebacks."""
    had = hasattr(sys, "tracebacklimit")
    before = getattr(sys, "tracebacklimit", 0)
    sys.tracebacklimit = SDK_FRAMES + KEPT
    try:
        yield
    finally:
        if had:
            sys.tracebacklimit = before
        else:
            del sys.tracebacklimit


__all__ = ["KEPT", "short_stack_trace"]
