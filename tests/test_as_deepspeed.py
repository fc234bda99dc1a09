"""``--as-deepspeed`` / DSLAUNCH_AS_DEEPSPEED: ``import deepspeed`` answered by dslaunch.

- every name of the public-API table resolves through the alias to the object the table names
  (and every missing one fails with the table's reason): the alias is generated from the table;
- the package metadata answers the checks Transformers and Accelerate make (their own functions);
- a real DeepSpeed on the path (a package directory, not a mock) is named in one line on rank 0;
- an unmodified ``import deepspeed`` script trains on dslaunch's engine under ``dslaunch run
  --as-deepspeed`` (2 ranks, ``--local_rank=N`` in argv) and, with the variable, under torchrun in
  a virtual environment where the package was installed editable (the .pth path).
"""

from __future__ import annotations

import importlib
import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dslaunch import as_deepspeed
from dslaunch.deepspeed_names import NAMES, resolve
from helpers import DSLAUNCH, ROOT, SCRIPTS, results

NOTICE = "`import deepspeed` gives dslaunch"
CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
          "zero_optimization": {"stage": 3}}


@pytest.fixture
def alias():
    if "deepspeed" in sys.modules:
        pytest.skip("a deepspeed module is already imported in this process")
    finder = as_deepspeed.install(environ={"RANK": "0", as_deepspeed._NOTICED: "1"})
    yield finder
    as_deepspeed.uninstall()


def _alias_lookup(name: str):
    """``name`` (deepspeed.X.Y) as a script reaches it: import the longest module prefix that
    imports, then getattr down."""
    parts, first = name.split("."), None
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if "dslaunch answers" in str(exc):  # the alias's answer, not Python's "not a package"
                first = first or exc
            if cut == 1:
                raise first from None
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError as exc:
            raise (first or exc) from None
        return obj
    raise AssertionError(name)


def test_every_table_name_resolves_through_the_alias(alias):
    for row in NAMES:
        if row.deepspeed == "deepspeed.__version__":
            assert _alias_lookup(row.deepspeed) == as_deepspeed.VERSION
        elif row.present:
            assert _alias_lookup(row.deepspeed) is resolve(row), row.deepspeed
        else:
            with pytest.raises((ImportError, AttributeError)) as err:
                _alias_lookup(row.deepspeed)
            assert row.why in str(err.value), row.deepspeed
    import deepspeed
    import deepspeed.runtime.zero.partition_parameters as pp

    import dslaunch
    assert deepspeed.zero is dslaunch.zero and deepspeed.initialize is dslaunch.initialize
    # the import system stamped the alias spec on dslaunch's module; its own is put back
    assert pp.__spec__.name == pp.__name__ == "dslaunch.runtime.zero.partition_parameters"
    with pytest.raises(ModuleNotFoundError, match="does not provide this DeepSpeed module"):
        importlib.import_module("deepspeed.runtime.zero.mics")
    with pytest.raises(ModuleNotFoundError, match="from deepspeed.runtime.zero import Init"):
        importlib.import_module("deepspeed.runtime.zero.Init")


def test_metadata_answers_the_frameworks_checks(alias):
    import importlib.metadata
    import importlib.util

    from accelerate.utils.versions import compare_versions
    from packaging.version import Version
    from transformers.integrations.deepspeed import is_deepspeed_available
    from transformers.utils.versions import require_version

    assert importlib.metadata.version("deepspeed") == as_deepspeed.VERSION
    assert importlib.util.find_spec("deepspeed") is not None
    assert is_deepspeed_available()
    require_version("deepspeed>=0.9.3")  # what HfDeepSpeedConfig runs; raises if unmet
    assert compare_versions("deepspeed", ">=", "0.16.4")  # Accelerate's newest gate
    assert not compare_versions("deepspeed", "<", "0.14.0")
    import deepspeed
    assert Version(deepspeed.__version__).public == "0.19.8"  # Lightning, TRL compare this one
    # a scan of given directories (what pip does to list what is installed) finds no DeepSpeed
    assert not [d for d in importlib.metadata.distributions(path=sys.path)
                if d.metadata["Name"] == "deepspeed"]


def test_off_by_default():
    """Without the switch nothing answers for deepspeed (this venv has no DeepSpeed)."""
    code = "import importlib.util as u; print(u.find_spec('deepspeed'))"
    env = {k: v for k, v in os.environ.items() if k != as_deepspeed.ENV}
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


def _fake_deepspeed(tmp_path: Path) -> Path:
    """A real package named deepspeed on the path (what an installed DeepSpeed looks like to
    the import system)."""
    pkg = tmp_path / "site" / "deepspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0.1-real'\n")
    return pkg.parent


@pytest.mark.parametrize("rank, imported_first", [("0", False), ("1", False), ("0", True)])
def test_real_deepspeed_is_named_not_shadowed_silently(tmp_path, rank, imported_first):
    fake = _fake_deepspeed(tmp_path)
    code = ("import sys; import deepspeed as before\n" if imported_first else "") + textwrap.dedent("""
        from dslaunch import as_deepspeed
        as_deepspeed.install()
        import deepspeed
        print(deepspeed.__version__)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSLAUNCH_AS_DEEPSPEED")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(env, PYTHONPATH=f"{ROOT}{os.pathsep}{fake}", RANK=rank))
    if imported_first:
        assert out.stdout.strip() == "0.0.1-real"
        assert "was imported before the switch took effect and stays" in out.stderr
        return
    assert out.stdout.strip() == as_deepspeed.VERSION
    lines = [line for line in out.stderr.splitlines() if NOTICE in line]
    assert len(lines) == (1 if rank == "0" else 0), out.stderr
    if lines:
        assert str(fake / "deepspeed") in lines[0] and "unset DSLAUNCH_AS_DEEPSPEED" in lines[0]


@pytest.fixture(scope="module")
def dslaunch_job(tmp_path_factory):
    """The unmodified script on 2 ranks under `dslaunch run --as-deepspeed`, with a real-looking
    DeepSpeed on PYTHONPATH."""
    tmp = tmp_path_factory.mktemp("as_ds")
    fake = _fake_deepspeed(tmp)
    (tmp / "ds.json").write_text(json.dumps(CONFIG))
    cmd = [*DSLAUNCH, "run", "--as-deepspeed", "--nproc-per-node", "2", "--omp-threads", "1",
           "--grace-period", "1", str(SCRIPTS / "deepspeed_unmodified.py"), "--deepspeed",
           "--deepspeed_config", str(tmp / "ds.json"), "--out", str(tmp / "out")]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{fake}", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc


@pytest.mark.slow
def test_unmodified_script_runs_on_our_engine(dslaunch_job):
    tmp, proc = dslaunch_job
    ranks = results(tmp / "out", 2)
    for r, res in enumerate(ranks):
        assert res["engine_module"].startswith("dslaunch"), res
        assert res["comm_module"].startswith("dslaunch") and \
            res["accelerator_module"].startswith("dslaunch")
        assert all(m.startswith("dslaunch") for m in res["adam_modules"])
        assert res["deepspeed_version"] == as_deepspeed.VERSION
        assert res["argv"][0] == f"--local_rank={r}" and res["local_rank_arg"] == r
        assert res["zero_stage"] == 3 and res["full_numel"] == 8 * 16 + 16 + 16 + 1
    assert ranks[0]["losses"] == ranks[1]["losses"]
    # the fake DeepSpeed on the path is named once, by rank 0
    assert sum(NOTICE in line for line in (proc.stdout + proc.stderr).splitlines()) == 1


def _installed_dslaunch() -> dict:
    """This environment's installed dslaunch files (name -> mtime)."""
    return {p.name: p.stat().st_mtime_ns for sp in site.getsitepackages()
            for p in Path(sp).glob("*dslaunch*")}


@pytest.mark.slow
def test_env_var_under_torchrun_after_editable_install(tmp_path, dslaunch_job):
    """``pip install -e .`` puts the .pth in site-packages; with DSLAUNCH_AS_DEEPSPEED=1 torchrun's
    workers (plain interpreters, no dslaunch bootstrap) get the alias and train as under
    `dslaunch run --as-deepspeed`: the same losses."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = next(venv.glob("lib/python3*/site-packages"))
    # this interpreter's packages (torch, pip's setuptools) visible in the new venv
    (purelib / "shared.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    # pip runs as the new venv's (--python): its environment is the new venv, so it never touches
    # this one's dslaunch (with --prefix it would uninstall that first)
    ours = _installed_dslaunch()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    "-q", "--no-build-isolation", "--no-deps", "-e", str(ROOT)], check=True,
                   capture_output=True)
    assert _installed_dslaunch() == ours
    assert (purelib / "dslaunch_as_deepspeed.pth").read_text() == \
        (ROOT / "dslaunch_as_deepspeed.pth").read_text()
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE") and "DSLAUNCH" not in k}
    env["OMP_NUM_THREADS"] = "1"
    off = subprocess.run([python, "-c", "import deepspeed"], env=env, capture_output=True, text=True)
    assert off.returncode != 0 and "No module named 'deepspeed'" in off.stderr
    out = tmp_path / "out"
    (tmp_path / "ds.json").write_text(json.dumps(CONFIG))
    proc = subprocess.run(
        [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(SCRIPTS / "deepspeed_unmodified.py"), "--deepspeed", "--deepspeed_config",
         str(tmp_path / "ds.json"), "--out", str(out)],
        env=dict(env, DSLAUNCH_AS_DEEPSPEED="1"), cwd=tmp_path, capture_output=True, text=True,
        timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = results(out, 2)
    for r, res in enumerate(ranks):
        assert res["engine_module"].startswith("dslaunch")
        assert res["deepspeed_file"] == str(ROOT / "dslaunch" / "__init__.py")  # the editable one
        assert res["local_rank_arg"] == -1 and res["local_rank_env"] == r  # torchrun adds none
    assert NOTICE not in proc.stderr  # no other DeepSpeed here
    assert ranks[0]["losses"] == results(dslaunch_job[0] / "out", 2)[0]["losses"]


def test_dry_run_shows_the_switch():
    """`--as-deepspeed` is data in the plan: the variable on every rank, --local_rank=N right
    after the script (or module), before its arguments."""
    from dslaunch.launcher.plan import WorldPlan

    out = subprocess.run([*DSLAUNCH, "run", "--as-deepspeed", "--nproc-per-node", "2", "--dry-run",
                          "--json", "-m", "pkg.train", "--lr", "1"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    plan = WorldPlan.from_json(out.stdout)
    assert plan.env["DSLAUNCH_AS_DEEPSPEED"] == "1" and plan.local_rank_arg
    assert plan.rank_program(1) == ["-m", "pkg.train", "--local_rank=1", "--lr", "1"]
    plain = WorldPlan.from_json(subprocess.run(
        [*DSLAUNCH, "run", "--dry-run", "--json", "-m", "pkg.train", "--lr", "1"], cwd=ROOT,
        capture_output=True, text=True, check=True).stdout)
    assert "DSLAUNCH_AS_DEEPSPEED" not in plain.env
    assert plain.rank_program(0) == ["-m", "pkg.train", "--lr", "1"]
    no_arg = WorldPlan.from_json(subprocess.run(
        [*DSLAUNCH, "run", "--as-deepspeed", "--no_local_rank", "--dry-run", "--json", "-m", "pkg.train"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    assert no_arg.env["DSLAUNCH_AS_DEEPSPEED"] == "1" and no_arg.rank_program(0) == ["-m", "pkg.train"]
