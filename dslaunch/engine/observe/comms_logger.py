"""DeepSpeed's communication logger: every collective's latency per op and message size, with
its algorithmic and bus bandwidth (``comms_logger`` config section, ``dslaunch.comm.configure``,
``dslaunch.comm.log_summary``).

``comm.py`` books every collective (the engine's and the script's ``dslaunch.comm`` calls) in one
place, ``Comm._run``; when the logger is enabled, that place also hands the call here: its name
as booked (so the logger's ``count x message size`` per op adds up to ``engine.comm_stats()``'s
bytes), its payload bytes and its latency, with the device synchronised first as DeepSpeed does
(a queued NCCL kernel has not finished when the call returns). Disabled, the booking path pays one
attribute test per collective.

Bandwidths follow DeepSpeed's formulas (nccl-tests' definitions), in Gbit/s, for ``n`` ranks and
a payload of ``S`` bytes as booked (all_gather: this rank's input; reduce_scatter: the whole
input; others: the tensor handed over), latency ``t``:

- all_reduce: algbw ``2S/t``, busbw ``S/t x 2(n-1)/n``
- all_gather: algbw ``nS/t``, busbw ``nS/t x (n-1)/n``
- reduce_scatter, all_to_all: algbw ``S/t``, busbw ``S/t x (n-1)/n``
- broadcast, reduce, gather, scatter, send, recv, barrier and the rest: busbw = algbw = ``S/t``.
"""

from __future__ import annotations

import datetime
import sys

PROFILED_MODULES = ("dslaunch/engine/comm", "dslaunch/comm.py", "dslaunch/engine/observe/comms_logger")


def convert_size(size_bytes: int) -> str:
    """``1536`` -> ``"1.5 KB"`` (DeepSpeed's form, powers of 1024)."""
    if size_bytes <= 0:
        return "0B"
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    i = 0
    value = float(size_bytes)
    while value >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    return f"{round(value, 2)} {units[i]}"


def bandwidths(op: str, size: int, latency_ms: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in Gbit/s of ``op`` moving ``size`` bytes in ``latency_ms`` on ``world``
    ranks (see the module docstring); ``op`` is matched by its ending, as ``comm.sent_bytes``."""
    if latency_ms <= 0 or size <= 0:
        return 0.0, 0.0
    n = max(world, 1)
    per_ms = size / latency_ms
    if op.endswith("all_reduce"):
        alg, bus = 2 * per_ms, per_ms * 2 * (n - 1) / n
    elif op.endswith("all_gather"):
        alg = n * per_ms
        bus = alg * (n - 1) / n
    elif op.endswith(("reduce_scatter", "all_to_all")):
        alg, bus = per_ms, per_ms * (n - 1) / n
    else:
        alg = bus = per_ms
    to_gbps = 8 / 1e6  # bytes/ms -> Gbit/s
    return alg * to_gbps, bus * to_gbps


def trim_mean(values: list, fraction: float = 0.1) -> float:
    """The mean without the lowest and highest ``fraction`` of the values (DeepSpeed's)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    cut = int(len(ordered) * fraction)
    kept = ordered[cut:len(ordered) - cut] or ordered
    return sum(kept) / len(kept)


def _caller() -> str:
    """The first function outside the comm layer on the stack (``debug``: who called)."""
    frame = sys._getframe(2)
    while frame is not None and any(m in frame.f_code.co_filename.replace("\\", "/")
                                    for m in PROFILED_MODULES):
        frame = frame.f_back
    return frame.f_code.co_name if frame is not None else "?"


class CommsLogger:
    """The process's record: ``comms_dict[name][msg_size] = [count, [latency ms], [algbw],
    [busbw]]`` (DeepSpeed's layout)."""

    def __init__(self):
        self.comms_dict: dict = {}
        self.enabled = False
        self.verbose = False
        self.prof_all = True
        self.prof_ops: list = []
        self.debug = False

    # -- switches --------------------------------------------------------------------------------
    def configure(self, section) -> None:
        """From a ``comms_logger`` section (the typed config's, or a dict)."""
        get = section.get if isinstance(section, dict) else (lambda k, d=None: getattr(section, k, d))
        self.enabled = bool(get("enabled", False))
        if self.enabled:
            self.verbose = bool(get("verbose", False))
            self.debug = bool(get("debug", False))
            self.prof_all = bool(get("prof_all", True))
            self.prof_ops = list(get("prof_ops", None) or [])

    def start_profiling_comms(self):
        self.prof_all = True

    def stop_profiling_comms(self):
        self.prof_all = False

    def start_profiling_op(self, op_name_list):
        self.prof_ops = list(set(self.prof_ops) | set(op_name_list))

    def stop_profiling_op(self, op_name_list):
        self.prof_ops = [op for op in self.prof_ops if op not in op_name_list]

    def wants(self, name: str) -> bool:
        return self.prof_all or name in self.prof_ops

    # -- records ---------------------------------------------------------------------------------
    def append(self, raw_name: str, record_name: str, latency_ms: float, msg_size: int,
               world: int) -> None:
        algbw, busbw = bandwidths(raw_name, msg_size, latency_ms, world)
        per_size = self.comms_dict.setdefault(record_name, {})
        rec = per_size.get(msg_size)
        if rec is None:
            per_size[msg_size] = [1, [latency_ms], [algbw], [busbw]]
        else:
            rec[0] += 1
            rec[1].append(latency_ms)
            rec[2].append(algbw)
            rec[3].append(busbw)
        if self.verbose:
            import torch.distributed as dist

            if not dist.is_initialized() or dist.get_rank() == 0:
                print(f"[dslaunch] comm op: {record_name} | time (ms): {latency_ms:.2f} | msg size: "
                      f"{convert_size(msg_size)} | algbw (Gbps): {algbw:.2f} | busbw (Gbps): "
                      f"{busbw:.2f}", flush=True)

    def record(self, name: str, nbytes: int, seconds: float, world: int) -> None:
        """What ``comm.py`` calls after a collective completes (the logger is enabled)."""
        if self.prof_all or name in self.prof_ops:
            record_name = f"{name} | [Caller Func: {_caller()}]" if self.debug else name
            self.append(name, record_name, seconds * 1e3, int(nbytes), world)

    def get_raw_data(self) -> dict:
        return self.comms_dict.copy()

    def has_data(self) -> bool:
        return bool(self.comms_dict)

    def reset_data(self) -> None:
        self.comms_dict.clear()

    def get_operation_names(self) -> list:
        return list(self.comms_dict)

    def get_total_operations(self) -> int:
        return sum(v[0] for sizes in self.comms_dict.values() for v in sizes.values())

    def summary(self) -> dict:
        """{op: {msg_size: {count, total_latency_ms, avg_latency_ms (10% trimmed mean),
        tput_avg_gbps, busbw_avg_gbps, msg_size_bytes, msg_size_str}}}"""
        out = {}
        for name, sizes in list(self.comms_dict.items()):
            out[name] = {}
            for size, (count, lats, algs, buses) in sorted(sizes.items()):
                out[name][size] = {
                    "count": count, "total_latency_ms": sum(lats),
                    "avg_latency_ms": trim_mean(lats), "tput_avg_gbps": trim_mean(algs),
                    "busbw_avg_gbps": trim_mean(buses), "msg_size_bytes": size,
                    "msg_size_str": convert_size(size)}
        return out

    def straggler(self, min_over_ranks) -> dict:
        """DeepSpeed's straggler analysis: per op and message size, each call's latency minus the
        smallest any rank saw for that call (``min_over_ranks(list of ms) -> list``, a MIN
        all-reduce: collective, so every rank calls it having logged the same calls).
        {op: {msg_size: {count, total_comm_lat_ms, total_straggler_ms, avg_comm_lat_ms,
        avg_straggler_ms, msg_size_bytes, msg_size_str}}}"""
        out = {}
        for name, sizes in sorted(self.comms_dict.items()):
            out[name] = {}
            for size, (count, lats, _, _) in sorted(sizes.items()):
                mins = min_over_ranks(list(lats))
                late = [a - b for a, b in zip(lats, mins)]
                out[name][size] = {
                    "count": count, "total_comm_lat_ms": sum(mins),
                    "total_straggler_ms": sum(late), "avg_comm_lat_ms": trim_mean(mins),
                    "avg_straggler_ms": trim_mean(late), "msg_size_bytes": size,
                    "msg_size_str": convert_size(size)}
        return out

    @staticmethod
    def format_straggler(analysis: dict) -> str:
        return "\n".join(["_______________________________", "Breakdown with straggler effect",
                          "-------------------------------", _table(analysis, (
                              ("Total comm lat(ms)", "total_comm_lat_ms"),
                              ("Total straggler(ms)", "total_straggler_ms"),
                              ("Avg comm lat(ms)", "avg_comm_lat_ms"),
                              ("Avg straggler(ms)", "avg_straggler_ms")))])

    def get_operation_summary(self, operation_name):
        return self.summary().get(operation_name)

    def format_summary(self, summary: dict | None = None) -> str:
        return _table(self.summary() if summary is None else summary, (
            ("Total Latency(ms)", "total_latency_ms"), ("Avg Latency(ms)", "avg_latency_ms"),
            ("tput_avg (Gbps)", "tput_avg_gbps"), ("busbw_avg (Gbps)", "busbw_avg_gbps")))

    def metadata(self) -> dict:
        import torch.distributed as dist

        on = dist.is_initialized()
        return {"world_size": dist.get_world_size() if on else 1,
                "rank": dist.get_rank() if on else 0,
                "timestamp": datetime.datetime.now().isoformat()}


COMMS_LOGGER = CommsLogger()  # the process's one logger (DeepSpeed's deepspeed.comm.comms_logger)


def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None,
              debug=None):
    """DeepSpeed's switches of the comms logger: from a config (its ``comms_logger`` section:
    a config dict, the engine's typed config, or the section itself) and/or one by one."""
    if deepspeed_config is not None:
        section = (deepspeed_config.get("comms_logger") if isinstance(deepspeed_config, dict)
                   else getattr(deepspeed_config, "comms_logger", deepspeed_config))
        if section is not None:
            COMMS_LOGGER.configure(section)
    if enabled is not None:
        COMMS_LOGGER.enabled = bool(enabled)
    if prof_all is not None:
        COMMS_LOGGER.prof_all = bool(prof_all)
    if prof_ops is not None:
        COMMS_LOGGER.prof_ops = list(prof_ops)
    if verbose is not None:
        COMMS_LOGGER.verbose = bool(verbose)
    if debug is not None:
        COMMS_LOGGER.debug = bool(debug)


def _table(per_op: dict, columns) -> str:
    """DeepSpeed's printed layout: 20-wide columns, the op on its own line, then one row per
    message size: size, count, and ``columns`` ((title, record key) of floats, 2 decimals)."""
    head = ("Comm. Op", "Message Size", "Count", *(title for title, _ in columns))
    lines = ["".join(f"{c:<20}" for c in head)]
    for name, sizes in per_op.items():
        lines.append(name)
        for rec in sizes.values():
            lines.append(f"{'':<20}{rec['msg_size_str']:<20}{rec['count']:<20}"
                         + "".join(f"{rec[key]:<20.2f}" for _, key in columns))
    return "\n".join(lines)
