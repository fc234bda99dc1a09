"""A newcomer's first hour (issue 46): the commands the README names, typed as a user types them
(the installed ``dslaunch`` entry point as a subprocess, real files in tmp_path), give the right
answer the first time.

1. ``dslaunch hosts check -H hostfile`` checks each host the way ``dslaunch run`` with the same
   hostfile reaches it: a ``localhost`` hostfile on this host itself (run's local launcher), not
   over ssh; the table and the JSON say which way.
2. A DeepSpeed config given as the script's own argument (``train.py --config ds.json``,
   ``--deepspeed_config FILE``, ``--deepspeed_config=FILE``) is checked before any rank starts,
   as ``dslaunch run --config`` is; the script's own (non-DeepSpeed) ``--config`` is left alone.
3. Every plain-text table the CLI prints lines up whatever the names (``cpu_block_sparse_attn``).
4. Every declared dependency is used (paramiko was not: the launcher uses OpenSSH).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from helpers import ROOT, dslaunch

# A rank script that imports nothing heavy: it records its argv (what the script was given).
ARGV_SCRIPT = """\
import json, os, sys
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "rank_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(sys.argv[1:], f)
"""


def _script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(ARGV_SCRIPT)
    return path


def _ranks_argv(tmp_path, nproc=2) -> list:
    return [json.loads((tmp_path / "out" / f"rank_{r}.json").read_text()) for r in range(nproc)]


def _error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.strip()]


# ---- 1. hosts check reaches a host the way run does -----------------------------------------------

def test_hosts_check_localhost_hostfile_is_checked_here_as_run_would(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=2\n")
    table = dslaunch("hosts", "check", "-H", hf, cwd=tmp_path)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "ssh" not in table.stdout + table.stderr
    assert "launcher local" in table.stdout
    row = next(line for line in table.stdout.splitlines() if "localhost" in line)
    cells = [c.strip() for c in row.strip().strip("│").split("│")]
    assert cells[:3] == ["localhost", "local", "ok"], row

    doc = json.loads(dslaunch("hosts", "check", "-H", hf, "--json", cwd=tmp_path).stdout)
    assert (doc["launcher"], doc["via"], doc["ok"]) == ("local", "local", True)
    (host,) = doc["hosts"]
    assert (host["host"], host["via"], host["status"]) == ("localhost", "local", "ok")
    assert (host["python"], host["torch"], host["dslaunch"]) == (
        doc["local"]["python"], doc["local"]["torch"], doc["local"]["dslaunch"])

    # the same hostfile under run: the local launcher, and the job runs
    plan = dslaunch("run", "-H", hf, "--dry-run", "--json", _script(tmp_path), cwd=tmp_path)
    assert json.loads(plan.stdout)["launcher"] == doc["launcher"]
    job = dslaunch("run", "-H", hf, _script(tmp_path), "a", cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    assert _ranks_argv(tmp_path) == [["a"], ["a"]]


def test_hosts_check_remote_host_goes_the_way_run_launches(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=1\nno-such-host.invalid slots=1\n")
    res = dslaunch("hosts", "check", "-H", hf, "--json", "--timeout", "5", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    plan = json.loads(dslaunch("run", "-H", hf, "--dry-run", "--json", _script(tmp_path),
                               cwd=tmp_path).stdout)
    assert doc["launcher"] == plan["launcher"] != "local"  # pdsh or ssh, as run picks
    assert doc["via"] == "ssh" and [h["via"] for h in doc["hosts"]] == ["ssh", "ssh"]
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["no-such-host.invalid"]["status"] == "down"
    assert "ssh failed" in by["no-such-host.invalid"]["reason"]


def test_hosts_check_local_launcher_refuses_a_remote_host_like_run(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=1\nnode7 slots=1\n")
    check = dslaunch("hosts", "check", "-H", hf, "--launcher", "local", cwd=tmp_path)
    run = dslaunch("run", "-H", hf, "--launcher", "local", _script(tmp_path), cwd=tmp_path)
    assert check.returncode != 0 and run.returncode != 0
    why = "the local launcher runs only on this host, but the plan names node7"
    assert why in check.stderr and why in run.stderr
    assert "Traceback" not in check.stderr + run.stderr


# ---- 2. the config as the script's argument is checked before any rank starts ---------------------

TYPO = {"train_batch_size": 8, "zero_optimisation": {"stage": 1}}


def test_script_config_typo_is_refused_before_any_rank(tmp_path):
    script = _script(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps(TYPO))
    for args in (["--config", "ds.json"], ["--deepspeed_config", "ds.json"],
                 ["--deepspeed_config=ds.json"], ["--lr", "1", "--config=ds.json", "--x"]):
        r = dslaunch("run", "--nproc-per-node", 2, script, *args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "no rank was started" in r.stderr
        assert "zero_optimisation: unknown key; did you mean zero_optimization?" in r.stderr
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "out").exists()  # no rank ran


def test_script_config_missing_or_unreadable_is_one_line(tmp_path):
    script = _script(tmp_path)
    (tmp_path / "adir.json").mkdir()
    cases = {
        ("--config", "missing.json"): "the script's --config missing.json: no such file; no rank was started",
        ("--deepspeed_config", "missing"):
            "the script's --deepspeed_config missing: no such file; no rank was started",
        ("--deepspeed_config=nothere.yaml",):
            "the script's --deepspeed_config nothere.yaml: no such file; no rank was started",
        ("--config", "adir.json"): "the script's --config adir.json: cannot read it (Is a directory)",
    }
    for args, message in cases.items():
        r = dslaunch("run", script, *args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stderr)
        lines = _error_lines(r.stderr)
        assert len(lines) == 1 and message in lines[0], (args, r.stderr)
    assert not (tmp_path / "out").exists()


def test_script_config_valid_runs_with_its_arguments_untouched(tmp_path):
    script = _script(tmp_path)
    (tmp_path / "ds.yaml").write_text("train_micro_batch_size_per_gpu: 2\n"
                                      "fault_tolerance: {recover: in-process}\n")
    args = ["--deepspeed_config", "ds.yaml", "--tag", "x y"]
    r = dslaunch("run", "--nproc-per-node", 2, script, *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _ranks_argv(tmp_path) == [args, args]
    # the launcher's own setting comes from it when there is no `dslaunch run --config`
    plan = json.loads(dslaunch("run", "--dry-run", "--json", script, *args, cwd=tmp_path).stdout)
    assert plan["recover"] == "in-process" and plan["config"] is None


def test_script_own_config_is_left_alone(tmp_path):
    """A model/trainer config named by --config (shares a key or two with DeepSpeed's, or is not
    a file at all) is the script's business: the job runs, arguments untouched."""
    script = _script(tmp_path)
    (tmp_path / "model.yaml").write_text("model: {layers: 2}\noptimizer: {lr: 0.1}\n"
                                         "gradient_accumulation_steps: 2\nfp16: true\n")
    (tmp_path / "train.yaml").write_text("train_batch_size: 4\nlearning_rate: 0.1\n"
                                         "output_dir: out\nepochs: 3\n")
    (tmp_path / "tokens.json").write_text("[1, 2, 3]")
    (tmp_path / "bad.json").write_text(json.dumps(TYPO))
    args = ["--config", "model.yaml", "--config=train.yaml", "--config", "small", "--config",
            "tokens.json", "--", "--config", "bad.json"]  # after `--`: positional words
    r = dslaunch("run", "--nproc-per-node", 2, script, *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _ranks_argv(tmp_path) == [args, args]


def test_script_config_relative_to_chdir_and_both_spellings(tmp_path):
    script = _script(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "ds.json").write_text(json.dumps(TYPO))
    (tmp_path / "good.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1}))
    r = dslaunch("run", "--chdir", work, script, "--config", "ds.json", cwd=tmp_path)
    assert r.returncode == 1 and "zero_optimisation" in r.stderr, r.stderr
    # `dslaunch run --config` good, the script's config bad: both are checked
    r = dslaunch("run", "--config", "good.json", script, "--deepspeed_config", "work/ds.json",
                 cwd=tmp_path)
    assert r.returncode == 1 and "no rank was started" in r.stderr, r.stderr
    # both good and different: the job runs and the launcher says which one the script reads
    (work / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    r = dslaunch("run", "--config", "good.json", script, "--deepspeed_config", "work/ds.json",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "note: --config good.json goes to the ranks in DSLAUNCH_CONFIG" in r.stderr
    assert "dslaunch.initialize(args=...) reads the script's" in r.stderr


# ---- 3. every plain table lines up whatever the names ----------------------------------------------

def _columns_line_up(header: str, rows: list, align: str) -> None:
    """Each row's cells start (``<``) or end (``>``) where the header's do."""
    names = header.split()
    starts, pos = [], 0
    for name in names:
        pos = header.index(name, pos)
        starts.append(pos)
        pos += len(name)
    ends = [s + len(n) for s, n in zip(starts, names)]
    for row in rows:
        for i, a in enumerate(align):
            if a == "<":
                assert row[starts[i]] != " " and (starts[i] == 0 or row[starts[i] - 1] == " "), \
                    (header, row)
            else:
                assert row[ends[i] - 1] != " " and row[ends[i]] == " ", (header, row)


def test_report_op_table_lines_up_with_long_op_names():
    r = dslaunch("report")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = lines.index(next(line for line in lines
                         if line.split() == ["op", "kind", "compatible", "built", "loaded", "status"]))
    header, rows = lines[i], lines[i + 1:]
    assert any(row.startswith("cpu_block_sparse_attn ") for row in rows)
    _columns_line_up(header, rows, "<<<<<<")


def test_estimate_memory_table_lines_up():
    r = dslaunch("estimate-memory", "--params", "7B", "--world-size", "64")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[1]
    rows = [line for line in lines[2:] if line.startswith("  stage")]
    assert len(rows) >= 5
    # "per rank device" is three words: compare the right edges of the number columns
    heads = ["per rank device", "per rank cpu", "per host device", "per host cpu", "per rank nvme"]
    ends = [header.index(h) + len(h) for h in heads]
    for row in rows:
        for end in ends:
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (header, row)


def test_straggler_report_lines_up_with_long_host_names(tmp_path):
    rows = [{"rank": r, "host": host, "step_time": st, "compute": c, "collectives": st - c,
             "first_step": 1, "last_step": 9}
            for r, host, st, c in [(0, "a", 0.5, 0.4), (1, "a-very-long-host-name.example.org", 0.5, 0.4),
                                   (2, "b", 12.5, 12.0), (10, "b", 0.5, 0.45)]]
    (tmp_path / "status.json").write_text(json.dumps({"ranks": [], "job": rows, "state": "done"}))
    r = dslaunch("top", "--log-dir", tmp_path, "--stragglers")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("rank"))
    header = lines[i]
    table = lines[i + 1:i + 5]
    assert "<- straggler" in table[2]
    for row in table:  # right edges of rank / the three times, left edge of host
        for name in ("rank", "step time", "compute", "in collectives"):
            end = header.index(name) + len(name)
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (header, row)
        start = header.index("host")
        assert row[start] != " " and row[start - 1] == " ", (header, row)


def test_text_table_widths_come_from_the_cells():
    from dslaunch.launcher.text_table import text_table

    lines = text_table([("op", "n", "status"), ("cpu_block_sparse_attn", 3, "ok"), ("a", 12345, "")],
                       align="<>")
    assert lines == ["op                         n  status",
                     "cpu_block_sparse_attn      3  ok",
                     "a                      12345"]


# ---- 4. every declared dependency is used ----------------------------------------------------------

# distribution name -> the module it is imported as, where the two differ
IMPORT_NAMES = {"pyyaml": "yaml"}


def test_every_declared_dependency_is_imported():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the project's venv)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in deps}
    imported = set()
    for path in (ROOT / "dslaunch").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    unused = sorted(n for n in names if IMPORT_NAMES.get(n, n) not in imported)
    assert not unused, f"declared in pyproject.toml but imported nowhere in dslaunch/: {unused}"
    assert "paramiko" not in names  # the launcher uses the OpenSSH client, as DeepSpeed does
