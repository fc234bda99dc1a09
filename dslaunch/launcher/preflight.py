"""Before any rank starts: check every host of the plan in parallel (reachable, same Python / torch
/ dslaunch as this host, working directory and script present, master port free on the first host)
and refuse with a table of what differs. ``--no-preflight`` skips it.
"""

from __future__ import annotations

from dslaunch.launcher import hosts_check
from dslaunch.launcher.runners.base import RunnerError


def run_preflight(plan, options: dict, transport, via: str | None = None) -> list:
    """``transport``: the runner's ``probe_transport`` (``via``: its ``probe_via``)."""
    hosts = [n["host"] for n in plan.nodes]
    script = None
    if plan.program and plan.program[0] != "-m":
        script = plan.program[0]
    port = plan.master_port if plan.master_addr == hosts[0] else None
    results = hosts_check.check_hosts(hosts, transport, plan.python,
                                      timeout=float(options.get("preflight_timeout") or 20.0),
                                      port=port, cwd=plan.cwd, script=script, via=via)
    bad = [r for r in results if r["status"] != "ok"]
    if bad:
        names = ", ".join(f"{r['host']} ({r['status']})" for r in bad)
        lines = [f"preflight failed on {len(bad)} of {len(results)} host(s): {names}; no rank was "
                 f"started (--no-preflight skips this check)"]
        lines += ["  " + line for line in hosts_check.table_lines(results)]
        raise RunnerError("\n".join(lines))
    return results
