"""Byte counters of network interfaces, and the bytes a job moved between hosts in a window of
steps. Standard library only: the ranks of every runtime (DeepSpeed's venv too) and the harness
import it.

A rank reads its own namespace's counters from ``/proc/net/dev`` (``/proc/net`` is the reading
process's network namespace: the same counters as ``ip -s link`` run there); the harness reads the
root namespace's ends of the fake hosts' links from ``/sys/class/net/<link>/statistics``.
"""

from __future__ import annotations

from pathlib import Path


def parse_proc_net_dev(text: str) -> dict:
    """``/proc/net/dev`` -> ``{iface: {"rx_bytes": int, "tx_bytes": int}}``.

    Each data line is ``iface: <8 receive fields> <8 transmit fields>``; bytes are the first of
    each group. The two header lines have no ``:`` before the fields and are skipped."""
    out = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 16 or not fields[0].isdigit():
            continue
        out[name.strip()] = {"rx_bytes": int(fields[0]), "tx_bytes": int(fields[8])}
    return out


def read_iface(iface: str, proc_net_dev: str = "/proc/net/dev") -> tuple:
    """(rx_bytes, tx_bytes) of ``iface`` in this process's network namespace."""
    counters = parse_proc_net_dev(Path(proc_net_dev).read_text())
    if iface not in counters:
        raise KeyError(f"no interface {iface!r} in {proc_net_dev} (have {sorted(counters)})")
    c = counters[iface]
    return c["rx_bytes"], c["tx_bytes"]


def read_sysfs(link: str, root: str = "/sys/class/net") -> tuple:
    """(rx_bytes, tx_bytes) of ``link`` as the root namespace sees it."""
    stats = Path(root) / link / "statistics"
    return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())


def window_bytes(ranks: list, warmup: int, steps: int) -> dict:
    """Bytes that left and entered each host over the timed steps, from the ranks' samples.

    ``ranks``: the rank result dicts; each carries ``netdev = {"host", "iface", "rx", "tx"}`` with
    one sample before the first step and one after every step (so sample ``i`` is the counter
    after ``i`` steps). One rank per host is read (the lowest rank there: every rank of a host
    sees the same counters). The window runs from the end of the warm-up to the end of the last
    timed step. Every byte that crosses from one host to another leaves one host's eth0 and enters
    another's, so ``tx_bytes`` summed over the hosts is the inter-host traffic (``rx_bytes`` also
    counts what came from the launching host, e.g. the launcher's own connections)."""
    per_host = {}
    for r in sorted(ranks, key=lambda r: r["rank"]):
        nd = r.get("netdev")
        if not nd or nd["host"] in per_host:
            continue
        if len(nd["tx"]) < warmup + steps + 1:
            raise ValueError(f"rank {r['rank']}: {len(nd['tx'])} counter samples, "
                             f"need {warmup + steps + 1} (warm-up {warmup} + {steps} steps + 1)")
        a, b = warmup, warmup + steps
        per_host[nd["host"]] = {"tx_bytes": nd["tx"][b] - nd["tx"][a], "rx_bytes": nd["rx"][b] - nd["rx"][a]}
    if not per_host:
        return {"hosts": {}, "tx_bytes": None, "rx_bytes": None, "tx_bytes_per_step": None}
    tx = sum(h["tx_bytes"] for h in per_host.values())
    rx = sum(h["rx_bytes"] for h in per_host.values())
    return {"hosts": per_host, "steps": steps, "tx_bytes": tx, "rx_bytes": rx,
            "tx_bytes_per_step": round(tx / steps, 1), "rx_bytes_per_step": round(rx / steps, 1)}
