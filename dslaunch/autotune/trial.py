"""One experiment as one ``dslaunch run`` job of the user's script.

The trial's config is the user's with the experiment's stage, offload and micro-batch written in
and ``autotuning.metric_path`` set: the engine (``engine/observe/autotuning_meter.py``) then times the
profiled steps, writes the metrics there and exits, so a trial costs ``end_profile_step`` steps
plus the start. The job's output goes to ``<exps_dir>/<name>/job.log``. Its outcome:
- ``ok``: the metric file is there (or, rank 0 being on a host whose disk the tuner does not
  see, the metrics line rank 0 printed came back in the job's output);
- ``oom``: the log says the accelerator or the host ran out of memory;
- ``timeout``: still running after ``--trial-timeout`` seconds (the job is stopped);
- ``failed``: anything else (exit status and the last error line are kept).
None of these stops the search.

A trial job runs in its own process group and gets SIGTERM if the tuner dies (kill -9
included, Linux's parent-death signal), so an interrupted search leaves no job behind.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

_OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory|"
                  r"std::bad_alloc|DefaultCPUAllocator: can't allocate", re.IGNORECASE)
_METRICS_PREFIX = "[dslaunch] autotuning metrics: "  # engine/observe/autotuning_meter.py's LOG_PREFIX
_CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed-config", "--deepscale_config")


def trial_config(base: dict, exp, section_values: dict, metric_path: str) -> dict:
    cfg = copy.deepcopy(base)
    zero = cfg.setdefault("zero_optimization", {})
    zero["stage"] = exp.stage
    if exp.offload_optimizer != "none" or "offload_optimizer" in zero:
        zero.setdefault("offload_optimizer", {})["device"] = exp.offload_optimizer
    if exp.offload_param != "none" or "offload_param" in zero:
        zero.setdefault("offload_param", {})["device"] = exp.offload_param
    cfg["train_micro_batch_size_per_gpu"] = exp.micro_batch
    cfg["autotuning"] = dict(section_values, enabled=True, metric_path=metric_path)
    return cfg


def config_hash(cfg: dict) -> str:
    """What makes two trials the same: the config without where its metric goes."""
    clean = copy.deepcopy(cfg)
    clean.get("autotuning", {}).pop("metric_path", None)
    return hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest()[:16]


def _lookup(cfg: dict, dotted: str):
    node = cfg
    for name in dotted.split("."):
        if not isinstance(node, dict) or name not in node:
            return None
        node = node[name]
    return node


def script_args(args: list, config_path: str, cfg: dict, arg_mappings) -> list:
    """The user's arguments with a config flag pointing at the trial's config, and each
    ``arg_mappings`` flag (``{"train_micro_batch_size_per_gpu": "--per_device_batch"}``) set to
    the trial's value of its key."""
    out = list(args)
    for i, arg in enumerate(out):
        for flag in _CONFIG_FLAGS:
            if arg == flag and i + 1 < len(out):
                out[i + 1] = config_path
            elif arg.startswith(flag + "="):
                out[i] = f"{flag}={config_path}"
    for key, flag in (arg_mappings or {}).items():
        value = _lookup(cfg, key)
        if value is None:
            continue
        text = str(value)
        for i, arg in enumerate(out):
            if arg == flag and i + 1 < len(out):
                out[i + 1] = text
                break
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={text}"
                break
        else:
            out += [flag, text]
    return out


def _die_with_parent():  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_trial(command: list, log_path: str, metric_path: str, timeout: float,
              grace: float = 10.0) -> dict:
    """Runs the job, returns {status, seconds, returncode, error, metrics}."""
    if os.path.exists(metric_path):
        os.remove(metric_path)
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=preexec)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc, grace)
            rc = proc.returncode
    seconds = time.monotonic() - t0
    metrics = None
    if os.path.exists(metric_path):
        with open(metric_path) as f:
            metrics = json.load(f)
    with open(log_path, errors="replace") as f:
        text = f.read()
    if metrics is None:  # rank 0 on another host: its metrics line came back in the output
        metrics = _metrics_from_log(text)
    if metrics is not None:
        status, error = "ok", None
    elif timed_out:
        status, error = "timeout", f"still running after {timeout:g} s"
    elif _OOM.search(text):
        status, error = "oom", _OOM.search(text).group(0)
    else:
        status, error = "failed", _last_error(text, rc)
    return {"status": status, "seconds": round(seconds, 3), "returncode": rc, "error": error,
            "metrics": metrics}


def _metrics_from_log(text: str):
    for line in reversed(text.splitlines()):
        at = line.find(_METRICS_PREFIX)
        if at >= 0:
            try:
                return json.loads(line[at + len(_METRICS_PREFIX):])
            except ValueError:
                return None
    return None


def _stop(proc, grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_error(text: str, rc) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    last = lines[-1][-200:] if lines else ""
    for line in reversed(lines):
        if re.search(r"Error|error:|Exception|refused|invalid", line):
            more = f" | {last}" if last and last != line[-200:] else ""
            return f"exit {rc}: {line[-200:]}{more}"
    if rc == 0:
        return ("exit 0 without a metric file: the script ended before "
                "autotuning.end_profile_step (give it more steps)")
    return f"exit {rc}" + (f": {lines[-1][-300:]}" if lines else "")
