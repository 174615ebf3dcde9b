"""The autopilot (issue 40): recycles burned proxies and scales groups by
demand. Built so far: the policy (``policy.py``, stack config
``egress-proxies:autopilot``), the planner's inputs (``signals.py``,
``fleet.py``) and the planner itself (``plan.py``), which is pure: inputs
in, a plan out. The command that reads the signals and applies a plan
through Pulumi's Automation API comes later (docs/autopilot.md).
"""
