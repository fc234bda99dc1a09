"""Shared test helpers: the repository paths, the `dslaunch` CLI as a subprocess, and the cache of
expensive multi-process jobs that tests/conftest.py hands out as the ``job_cache`` fixture.

Import what you need in a test module (tests/ is on sys.path while pytest runs):

    from helpers import ROOT, SCRIPTS, dslaunch, launch, results, run_python

Why a module and not only conftest.py: tests/multihost/ has a conftest.py of its own, and pytest
loads both under the one module name ``conftest``, so ``from conftest import ...`` would pick up
whichever was loaded last. tests/conftest.py holds the fixtures (``job_cache``), which need no
import; this module holds what a test module imports.

API (everything a newcomer needs to start a real job):

- ``ROOT``, ``SCRIPTS`` (tests/scripts), ``EXAMPLES``; ``DSLAUNCH``: the argv prefix of the CLI
  (the venv's console script, or ``python -c`` where there is none).
- ``dslaunch(*args, cwd=ROOT, env=None, timeout=120)``: run any sub-command, return the
  CompletedProcess (never raises on a non-zero exit: assert on it).
- ``launch(workdir, config, script, args, nproc=2, env=None, check=True, timeout=120,
  grace_period=1, config_flag="--config")``: ``dslaunch run`` of a rank script (a name under
  tests/scripts, or a path) with a config dict written to workdir; raises with the output tails
  when ``check`` and it fails.
- ``run_python(script, args)``: the plain single-process run (the reference), launcher variables
  removed.
- ``results(out_dir, nproc)``: the ``rank_<r>.json`` files a rank script wrote.
- ``end_spawned_rank()``: the last call of a worker started with ``torch.multiprocessing``
  (tests/scripts/clean_exit.py: barrier, destroy the groups, ``os._exit(0)``).
- ``JobCache`` / the ``job_cache`` fixture: ``job_cache.run(name, script, *args, config=, nproc=,
  env=, flags=)`` (``flags``: launcher options such as ``("--as-deepspeed",)``),
  ``job_cache.python(name, script, *args)`` and ``job_cache.torchrun(name, script, *args)``
  (the same script under torchrun) start a job once per pytest session and
  return the same ``Job`` to every test (in any file) that asks for the same job; see the class.
- ``job_cache.run_many(label, script, {name: (args, config)}, nproc=, env=)``: several such jobs
  of one rank script in ONE ``dslaunch run`` (tests/scripts/many_runs.py runs them one after
  the other in the same ranks: torch, ~3 s of CPU per rank process, imported once), each cached
  as the Job ``run(name, script, *args, config=config, ...)`` then returns (its own directory,
  config and log). ``job_cache.python_many(label, script, {name: args})``: the same for plain
  single-process runs. Not for what needs a fresh process (peak RSS, a rank killed on purpose).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
EXAMPLES = ROOT / "examples"
_CONSOLE = Path(sys.executable).with_name("dslaunch")
DSLAUNCH = ([str(_CONSOLE)] if _CONSOLE.exists() else
            [sys.executable, "-c", "import sys; from dslaunch.cli import main; sys.exit(main())"])
# what a plain single-process reference must not inherit from a launcher that started pytest
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "DSLAUNCH_CONFIG")


def _script(script) -> Path:
    p = Path(script)
    return p if p.is_absolute() else SCRIPTS / p


def _tails(cmd, proc) -> str:
    return (f"{' '.join(map(str, cmd))} exited {proc.returncode}\n--- stdout\n"
            f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")


def dslaunch(*args, cwd=ROOT, env=None, timeout=120) -> subprocess.CompletedProcess:
    """``dslaunch ARGS...`` as a user types it; the caller asserts on returncode/stdout/stderr.
    ``env`` replaces the environment when given (pass ``dict(os.environ, ...)`` to extend it)."""
    return subprocess.run([*DSLAUNCH, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_argv(script, args, config_path=None, nproc: int = 2, grace_period=1,
             config_flag: str = "--config") -> list:
    """The argv of ``dslaunch run`` for a rank script (one thread per rank)."""
    cmd = [*DSLAUNCH, "run", "--nproc-per-node", str(nproc), "--omp-threads", "1"]
    if grace_period is not None:
        cmd += ["--grace-period", str(grace_period)]
    if config_path is not None and config_flag == "--config":
        cmd += ["--config", str(config_path)]
    cmd += [str(_script(script)), *map(str, args)]
    if config_path is not None and config_flag != "--config":  # a script argument instead
        cmd += [config_flag, str(config_path)]
    return cmd


def rank_env(env: dict | None = None) -> dict:
    """This environment, one OpenMP thread, unbuffered output, then ``env`` on top."""
    full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full.update(env or {})
    return full


def launch(workdir, config: dict | None, script, args: list, nproc: int = 2,
           env: dict | None = None, check: bool = True, timeout: int = 120, grace_period=1,
           config_flag: str = "--config") -> subprocess.CompletedProcess:
    """``dslaunch run --nproc-per-node N --omp-threads 1 [--config <workdir>/config_<hash>.json]
    script args...`` from ROOT. ``config_flag``: "--config" gives the file to the launcher; any
    other flag (e.g. "--deepspeed_config") passes it to the script instead, after its args."""
    cfg = None
    if config is not None:
        text = json.dumps(config, sort_keys=True)
        cfg = Path(workdir) / f"config_{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"
        cfg.write_text(text)
    cmd = run_argv(script, args, cfg, nproc, grace_period, config_flag)
    proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(env), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(_tails(cmd, proc))
    return proc


def run_python(script, args: list, timeout: int = 120) -> subprocess.CompletedProcess:
    """A plain single-process run (the reference), no launcher; raises if it fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in LAUNCHER_VARS:
        env.pop(k, None)
    cmd = [sys.executable, str(_script(script)), *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(_tails(cmd, proc))
    return proc


def results(out_dir, nproc: int = 2) -> list:
    return [json.loads((Path(out_dir) / f"rank_{r}.json").read_text()) for r in range(nproc)]


def end_spawned_rank() -> None:
    """End a spawned worker without gloo's teardown race (see tests/scripts/clean_exit.py)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    from clean_exit import exit_cleanly

    exit_cleanly()


# -- the session's cache of expensive jobs ---------------------------------------------------------

@dataclass
class Job:
    """One finished job. ``dir`` is its own directory (its config, and whatever its arguments
    wrote there through ``{dir}``): other tests may share the job, so treat ``dir`` as read-only
    and write derived files (reshaped checkpoints, exports) under your own tmp_path."""

    name: str
    key: str
    dir: Path
    argv: list
    proc: subprocess.CompletedProcess
    seconds: float
    _json: dict = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.proc.returncode == 0

    @property
    def log(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def json(self, name: str = "out.json") -> dict:
        """``dir/name`` parsed, a fresh copy per call (callers may change it); a ``losses`` dict
        gets its step keys back as ints (JSON made them strings)."""
        if name not in self._json:
            self._json[name] = (self.dir / name).read_text()
        res = json.loads(self._json[name])
        if isinstance(res, dict) and isinstance(res.get("losses"), dict):
            res["losses"] = {int(k): v for k, v in res["losses"].items()}
        return res

    def results(self, nproc: int | None = None, sub: str = "") -> list:
        """The ``rank_<r>.json`` files under ``dir/sub`` (a rank script's --out directory)."""
        return results(self.dir / sub, nproc if nproc is not None else self.nproc)

    @property
    def nproc(self) -> int:
        i = self.argv.index("--nproc-per-node") if "--nproc-per-node" in self.argv else -1
        return int(self.argv[i + 1]) if i >= 0 else 1


def _cut_log(text: str) -> dict:
    """A run_many job's stdout or stderr, cut at its ``@@many_runs <name>`` markers: {name: the
    lines after that run's marker}; what came before the first marker goes to the first run."""
    parts, name, lines = {}, None, []
    for line in text.splitlines(keepends=True):
        at = line.find("@@many_runs ")
        if at >= 0:
            if name is None:
                pre, lines = lines, []
            else:
                parts[name] = parts.get(name, "") + "".join(lines)
                lines = []
            name = line[at + len("@@many_runs "):].strip()
            if pre:
                parts[name], pre = "".join(pre), []
            continue
        lines.append(line)
    if name is not None:
        parts[name] = parts.get(name, "") + "".join(lines)
    return parts


def _fill(value, d: str):
    """``{dir}`` -> the job's directory, in strings, lists and dicts (arguments and configs)."""
    if isinstance(value, str):
        return value.replace("{dir}", d)
    if isinstance(value, dict):
        return {k: _fill(v, d) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_fill(v, d) for v in value]
    return value


class JobCache:
    """Expensive jobs, each started at most once per pytest session (tests/conftest.py makes one,
    the session-scoped ``job_cache`` fixture).

    ``run(name, script, *args, config=None, nproc=2, env=None, timeout=300, grace_period=None,
    config_flag="--config")`` -> Job: ``dslaunch run --nproc-per-node N --omp-threads 1
    [--config <dir>/config.json] <script> args...`` from ROOT (script: a name under tests/scripts
    or a path). ``python(name, script, *args, timeout=120)`` -> Job: the plain single-process
    run of ``run_python``. In ``args`` and in the config's strings ``{dir}`` stands for the job's
    own directory (``"--out", "{dir}/out.json"``, ``"--save", "{dir}/ck"``).

    The key is what the job does, not what it is called: kind, script, nproc, the config, the
    args (before ``{dir}`` is filled in), env and the launcher flags. Two tests, in one file or
    two, that describe the same job get the same Job, whatever name each gives it; the name only
    labels the directory (``<cache>/<name>-<key>``) and the summary. A job that failed is kept
    too: the next test asking for it fails at once with the same output instead of running it
    again (``check=False`` hands back the failed Job instead).
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.jobs: dict[str, Job] = {}
        self.hits = 0
        self.found: set = set()  # keys of jobs another process (xdist worker) ran
        self._held: dict = {}  # key -> its open lock file, while this process holds it

    @staticmethod
    def key_of(**what) -> str:
        text = json.dumps(what, sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    # -- shared between processes: the pytest-xdist workers of one run share ``root`` ------------
    @contextlib.contextmanager
    def _locked(self, keys):
        """Hold the lock of each key (an flock on ``root/.locks/<key>``; re-entrant in this
        process): the one process that holds it runs the job, another one asking for the same
        job waits, then finds its record. Taken in sorted order, so that two processes locking
        overlapping sets (run_many) cannot deadlock; a process that dies lets go of its locks."""
        (self.root / ".locks").mkdir(parents=True, exist_ok=True)
        mine = []
        try:
            for key in sorted(set(keys)):
                if key not in self._held:
                    f = open(self.root / ".locks" / key, "a")
                    self._held[key] = f
                    mine.append(key)
                    fcntl.flock(f, fcntl.LOCK_EX)
            yield
        finally:
            for key in mine:
                self._held.pop(key).close()

    def _record(self, key: str) -> Path:
        return self.root / ".records" / f"{key}.json"

    def _save(self, job: Job) -> None:
        """Write ``job`` where the other processes of this run find it (atomically)."""
        path = self._record(job.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"name": job.name, "key": job.key, "dir": str(job.dir),
                                   "argv": [str(a) for a in job.argv], "seconds": job.seconds,
                                   "returncode": job.proc.returncode, "stdout": job.proc.stdout,
                                   "stderr": job.proc.stderr}))
        os.replace(tmp, path)

    def _load(self, key: str) -> Job | None:
        """The Job another process of this run finished (None: not run yet)."""
        try:
            rec = json.loads(self._record(key).read_text())
        except FileNotFoundError:
            return None
        proc = subprocess.CompletedProcess(rec["argv"], rec["returncode"], rec["stdout"],
                                           rec["stderr"])
        job = Job(rec["name"], key, Path(rec["dir"]), rec["argv"], proc, rec["seconds"])
        self.jobs[key] = job
        self.found.add(key)
        return job

    @staticmethod
    def records(root: Path) -> list:
        """Every job recorded under ``root`` (all processes of the run): (name, seconds, ok)."""
        out = []
        for path in sorted((Path(root) / ".records").glob("*.json")):
            rec = json.loads(path.read_text())
            out.append((rec["name"], rec["seconds"], rec["returncode"] == 0))
        return out

    def _get(self, name, key, argv_of, env, timeout, check) -> Job:
        job = self.jobs.get(key)
        if job is None:
            with self._locked([key]):
                job = self._load(key)
                if job is None:
                    d = self.root / f"{name}-{key}"
                    d.mkdir(parents=True, exist_ok=True)
                    argv = argv_of(str(d))
                    t0 = time.perf_counter()
                    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                          timeout=timeout)
                    job = Job(name, key, d, argv, proc, time.perf_counter() - t0)
                    self.jobs[key] = job
                    self._save(job)
                else:
                    self.hits += 1
        else:
            self.hits += 1
        if check and not job.ok:
            raise AssertionError(f"job {job.name!r} failed (cached)\n" + _tails(job.argv, job.proc))
        return job

    def _run_key(self, script, args, config, nproc, env, grace_period=None,
                 config_flag="--config", flags=()) -> str:
        return self.key_of(kind="run", script=str(_script(script)), args=args, config=config,
                           nproc=nproc, env=env, grace=grace_period, flag=config_flag,
                           **({"flags": list(flags)} if flags else {}))

    @staticmethod
    def _write_config(config, d) -> Path | None:
        if config is None:
            return None
        cfg = Path(d) / "config.json"
        cfg.write_text(json.dumps(_fill(config, d)))
        return cfg

    def run(self, name: str, script, *args, config: dict | None = None, nproc: int = 2,
            env: dict | None = None, timeout: int = 300, grace_period=None,
            config_flag: str = "--config", check: bool = True, flags: tuple = ()) -> Job:
        args = [str(a) for a in args]
        key = self._run_key(script, args, config, nproc, env, grace_period, config_flag, flags)

        def argv_of(d):
            cfg = self._write_config(config, d)
            argv = run_argv(script, _fill(args, d), cfg, nproc, grace_period, config_flag)
            at = len(DSLAUNCH) + 1  # launcher flags (--as-deepspeed) right after `run`
            return [*argv[:at], *flags, *argv[at:]]

        return self._get(name, key, argv_of, rank_env(env), timeout, check)

    def run_many(self, label: str, script, runs: dict, nproc: int = 2, env: dict | None = None,
                 timeout: int = 300, flags: tuple = (), config_flag: str = "--config") -> None:
        """Start the runs of ``runs`` ({name: (args, config)}) that are not cached yet, all in
        ONE ``dslaunch run`` of ``nproc`` ranks (tests/scripts/many_runs.py runs them one after
        the other in the same rank processes: torch imported once per rank, not once per run),
        and cache each as the Job that ``run(name, script, *args, config=config, nproc=nproc,
        env=env)`` returns: its own directory, config file and log, ok when it finished. A run
        that failed fails its tests, and the runs after it (not started) fail theirs saying
        so. ``timeout``: per run. Not for what depends on a fresh process (peak RSS).
        A run given as ``(args, config, other_script)`` runs ``other_script`` instead (rank
        scripts that share the ranks' imports, e.g. transformers, and any global state they
        leave: each must start from its own seed). ``flags``: launcher options for the one
        launch, as ``run``'s (``("--as-deepspeed",)``: each run gets its ``--local_rank``);
        ``config_flag``: as ``run``'s (another than ``--config``: the config file is a script
        argument of each run, e.g. ``--deepspeed`` for the Hugging Face Trainer)."""
        todo = []
        for name, (args, config, *other) in runs.items():
            run_script = other[0] if other else script
            args = [str(a) for a in args]
            key = self._run_key(run_script, args, config, nproc, env, config_flag=config_flag,
                                flags=flags)
            if key not in self.jobs:
                todo.append((name, key, self.root / f"{name}-{key}", args, config, run_script))
        with self._locked([t[1] for t in todo]):
            todo = [t for t in todo if self._load(t[1]) is None]  # another worker ran them
            self._run_many(todo, nproc, env, timeout, flags, config_flag)

    def _run_many(self, todo, nproc, env, timeout, flags, config_flag) -> None:
        if not todo:
            return
        if len(todo) == 1:  # nothing to share: the plain launch
            name, _, _, args, config, run_script = todo[0]
            self.run(name, run_script, *args, config=config, nproc=nproc, env=env,
                     timeout=timeout, check=False, flags=flags, config_flag=config_flag)
            return
        for _, _, d, *_ in todo:
            d.mkdir(parents=True, exist_ok=True)
        spec = []
        for name, _, d, args, config, s in todo:
            cfg = self._write_config(config, str(d))
            argv = [str(_script(s)), *_fill(args, str(d))]
            if cfg is not None and config_flag != "--config":  # a script argument instead
                argv, cfg = [*argv, config_flag, str(cfg)], None
            spec.append({"name": name, "dir": str(d), "argv": argv,
                         "config_path": str(cfg) if cfg is not None else None})
        spec_file = todo[0][2] / "many_runs.json"
        spec_file.write_text(json.dumps(spec))
        at = len(DSLAUNCH) + 1  # launcher flags right after `run`
        argv = run_argv("many_runs.py", ["--spec", spec_file], None, nproc, None)
        argv[at:at] = flags
        self._split([(name, key, d, run_argv(s, args, None, nproc, None))
                     for name, key, d, args, _, s in todo], argv, rank_env(env), timeout)

    def _split(self, todo, argv, env, timeout) -> None:
        """Run the many_runs job ``argv`` and cache one Job per run of ``todo`` ((name, key, dir,
        the argv that runs it alone) each): its part of the log, ok when its ``.done`` is
        there."""
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout * len(todo))
        seconds = (time.perf_counter() - t0) / len(todo)
        out, err = _cut_log(proc.stdout), _cut_log(proc.stderr)
        failed = None
        for name, key, d, run_alone in todo:
            done = (d / ".done").exists()
            rc = 0 if done else (proc.returncode or 1)
            text = out.get(name, "")
            if not done and name not in out:
                text = f"not started: run {failed or '?'} of this many_runs job failed first\n"
            if not done and failed is None:
                failed = name
            run_proc = subprocess.CompletedProcess([*argv, "#", name], rc, text, err.get(name, ""))
            self.jobs[key] = Job(name, key, d, run_alone, run_proc, seconds)
            self._save(self.jobs[key])

    @staticmethod
    def _python_env() -> dict:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for k in LAUNCHER_VARS:
            env.pop(k, None)
        return env

    def python_many(self, label: str, script, runs: dict, timeout: int = 120) -> None:
        """``run_many`` for plain single-process runs: the runs of ``runs`` ({name: args}) not
        cached yet, one after the other in ONE python process (tests/scripts/many_runs.py), each
        cached as the Job ``python(name, script, *args)`` returns."""
        todo = []
        for name, args in runs.items():
            args = [str(a) for a in args]
            key = self.key_of(kind="python", script=str(_script(script)), args=args)
            if key not in self.jobs:
                todo.append((name, key, self.root / f"{name}-{key}", args))
        with self._locked([t[1] for t in todo]):
            todo = [t for t in todo if self._load(t[1]) is None]  # another worker ran them
            if len(todo) >= 2:  # else nothing to share: python() runs it
                self._python_many(script, todo, timeout)

    def _python_many(self, script, todo, timeout) -> None:
        for _, _, d, _ in todo:
            d.mkdir(parents=True, exist_ok=True)
        spec = [{"name": name, "dir": str(d), "argv": [str(_script(script)), *_fill(args, str(d))],
                 "config_path": None} for name, _, d, args in todo]
        spec_file = todo[0][2] / "many_runs.json"
        spec_file.write_text(json.dumps(spec))
        argv = [sys.executable, str(SCRIPTS / "many_runs.py"), "--spec", str(spec_file)]
        self._split([(name, key, d, [sys.executable, str(_script(script)), *args])
                     for name, key, d, args in todo], argv, self._python_env(), timeout)

    def python(self, name: str, script, *args, timeout: int = 120, check: bool = True) -> Job:
        args = [str(a) for a in args]
        key = self.key_of(kind="python", script=str(_script(script)), args=args)
        env = self._python_env()
        return self._get(name, key,
                         lambda d: [sys.executable, str(_script(script)), *_fill(args, d)],
                         env, timeout, check)

    def torchrun(self, name: str, script, *args, nproc: int = 2, timeout: int = 300,
                 check: bool = True) -> Job:
        """``torchrun --standalone --nproc-per-node N script args...`` (the torch reference)."""
        args = [str(a) for a in args]
        key = self.key_of(kind="torchrun", script=str(_script(script)), args=args, nproc=nproc)
        env = rank_env({"PYTHONPATH": str(ROOT)})
        for k in LAUNCHER_VARS:
            env.pop(k, None)
        return self._get(name, key,
                         lambda d: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                    "--nproc-per-node", str(nproc), str(_script(script)),
                                    *_fill(args, d)],
                         env, timeout, check)

    def summary(self) -> str:
        """The jobs this process ran (not those it found run by another worker) and its reuses."""
        ran = [j for k, j in self.jobs.items() if k not in self.found]
        return self.summary_of([(j.name, j.seconds, j.ok) for j in ran], self.hits)

    @staticmethod
    def summary_of(ran: list, hits: int) -> str:
        """``ran``: (name, seconds, ok) per job."""
        failed = [name for name, _, ok in ran if not ok]
        return (f"job_cache: {len(ran)} jobs run ({sum(s for _, s, _ in ran):.0f}s), {hits} reuses"
                + (f", failed: {', '.join(failed)}" if failed else ""))
