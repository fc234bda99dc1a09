"""The results directory: every trial (``trials.json``, rewritten whole after each trial, so a
search killed at any moment resumes from the trials it had finished), the best config
(``ds_config_optimal.json`` and ``cmd_optimal.txt``, DeepSpeed's names) and the table
(``summary.txt``, also printed)."""

from __future__ import annotations

import io
import json
import os

from .tuners import HIGHER_IS_BETTER

TRIALS = "trials.json"


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_trials(results_dir: str) -> list:
    path = os.path.join(results_dir, TRIALS)
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            return list(json.load(f).get("trials", []))
    except (OSError, ValueError):
        return []  # unreadable: start over rather than trust half of it


def save_trials(results_dir: str, header: dict, records: list, extra: dict | None = None) -> None:
    body = dict(header, trials=sorted(records, key=lambda r: r["index"]), **(extra or {}))
    _write_atomic(os.path.join(results_dir, TRIALS), json.dumps(body, indent=2) + "\n")


def write_best(results_dir: str, config: dict, command: list) -> tuple[str, str]:
    cfg_path = os.path.join(results_dir, "ds_config_optimal.json")
    cmd_path = os.path.join(results_dir, "cmd_optimal.txt")
    _write_atomic(cfg_path, json.dumps(config, indent=2) + "\n")
    _write_atomic(cmd_path, " ".join(command) + "\n")
    return cfg_path, cmd_path


def _fmt(value, digits=1):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def table(records: list, not_run: list, metric: str, best_name: str | None, dp: int, gas: int):
    """A rich Table of every trial, then every experiment not run (pruned or skipped)."""
    from rich.table import Table

    arrow = "higher" if HIGHER_IS_BETTER[metric] else "lower"
    t = Table(title=f"autotuning trials (metric: {metric}, {arrow} is better; * = best)")
    for col in ("", "trial", "stage", "offload opt/param", "micro", "batch", "status",
                "samples/s", "tokens/s", "latency s", "trial s", "note"):
        t.add_column(col, justify="right" if col in ("micro", "batch", "samples/s", "tokens/s",
                                                     "latency s", "trial s") else "left")
    for r in sorted(records, key=lambda r: r["index"]):
        m = r.get("metrics") or {}
        t.add_row("*" if r["name"] == best_name else "", r["name"], str(r["stage"]),
                  f"{r['offload_optimizer']}/{r['offload_param']}", str(r["micro_batch"]),
                  str(r["micro_batch"] * gas * dp), r["status"], _fmt(m.get("throughput")),
                  _fmt(m.get("tokens_per_sec"), 0), _fmt(m.get("latency"), 4),
                  _fmt(r.get("seconds")), (r.get("error") or "")[:60])
    for exp, status, reason in not_run:
        t.add_row("", exp.name, str(exp.stage), f"{exp.offload_optimizer}/{exp.offload_param}",
                  str(exp.micro_batch), str(exp.micro_batch * gas * dp), status, "-", "-", "-",
                  "-", reason[:60])
    return t


def table_text(t) -> str:
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=200, no_color=True).print(t)
    return buf.getvalue()
