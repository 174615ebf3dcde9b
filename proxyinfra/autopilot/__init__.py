"""The autopilot (issue 40): recycles burned proxies and scales groups by
demand. The planner is pure (``policy.py``, stack config
``egress-proxies:autopilot``; its inputs ``signals.py``, ``fleet.py``; the
planner ``plan.py``): inputs in, a plan out. The command beside it
(``command.py``, ``run.py``) reads the signals (``feed.py``) and applies a
plan as targeted Pulumi updates through the Automation API
(``automation.py`` behind the seam of ``seam.py``) (docs/autopilot.md).
"""
