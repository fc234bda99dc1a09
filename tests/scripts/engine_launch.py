"""Test helper: run a rank script on N local ranks through the real `dslaunch run` CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
_CONSOLE = Path(sys.executable).parent / "dslaunch"
DSLAUNCH = ([str(_CONSOLE)] if _CONSOLE.exists()
            else [sys.executable, "-c", "from dslaunch.cli import main; main()"])


def launch(tmp_path, config: dict, script: str, args: list, nproc: int = 2, env: dict | None = None,
           check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    """`dslaunch run --nproc-per-node N --config <config.json> script args...`."""
    cfg = Path(tmp_path) / f"config_{abs(hash(json.dumps(config, sort_keys=True)))}.json"
    cfg.write_text(json.dumps(config))
    cmd = DSLAUNCH + ["run", "--nproc-per-node", str(nproc), "--omp-threads", "1",
                      "--grace-period", "1", "--config", str(cfg), str(SCRIPTS / script)] + \
        [str(a) for a in args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n"
                             f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def run_python(script: str, args: list, timeout: int = 120) -> None:
    """A plain single-process run (the reference), no launcher."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DSLAUNCH_CONFIG"):
        env.pop(k, None)
    subprocess.run([sys.executable, str(SCRIPTS / script)] + [str(a) for a in args], cwd=ROOT,
                   env=env, check=True, timeout=timeout, capture_output=True)


def results(out_dir, nproc: int = 2) -> list:
    return [json.loads((Path(out_dir) / f"rank_{r}.json").read_text()) for r in range(nproc)]
