"""Plain Lightning and Accelerate DDP (no DeepSpeed) behave under `dslaunch run` as under torchrun:
2 CPU ranks (gloo), a tiny model, the same per-step losses on each rank and the same final
parameters, and the same layout detected by the framework (tests/scripts/frameworks_ddp.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, SCRIPTS, _tails, rank_env, results

FRAMEWORKS = ["lightning", "accelerate"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(framework, launcher): [rank 0 result, rank 1 result]}. One launch per launcher runs both
    frameworks, Accelerate then Lightning, one after the other in the same two ranks
    (tests/scripts/many_runs.py: torch and both frameworks imported once per rank)."""
    out, spec = {}, []
    for framework in FRAMEWORKS[::-1]:
        d = tmp_path_factory.mktemp(framework)
        spec.append({"name": framework, "dir": str(d), "config_path": None,
                     "argv": [str(SCRIPTS / "frameworks_ddp.py"), "--framework", framework,
                              "--out", str(d)]})
    for launcher, argv in (("dslaunch", [sys.executable, "-c", "import sys; from dslaunch.cli import main; "
                                         "sys.exit(main())", "run", "--nproc-per-node", "2",
                                         "--omp-threads", "1"]),
                           ("torchrun", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                         "--nproc-per-node", "2"])):
        runs = [{**r, "dir": str(Path(r["dir"]) / launcher),
                 "argv": [*r["argv"][:-1], str(Path(r["argv"][-1]) / launcher)]} for r in spec]
        for r in runs:
            Path(r["dir"]).mkdir()
        spec_file = tmp_path_factory.mktemp(f"spec-{launcher}") / "spec.json"
        spec_file.write_text(json.dumps(runs))
        cmd = [*argv, str(SCRIPTS / "many_runs.py"), "--spec", str(spec_file)]
        proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, _tails(cmd, proc)
        for r in runs:
            assert Path(r["dir"], ".done").exists(), _tails(cmd, proc)
            out[r["name"], launcher] = results(r["dir"], 2)
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_same_losses_and_parameters_as_under_torchrun(runs, framework):
    ours, torchrun = runs[framework, "dslaunch"], runs[framework, "torchrun"]
    for rank in range(2):
        assert len(ours[rank]["losses"]) == 5 + (framework == "accelerate")  # + save/load round trip
        assert ours[rank]["losses"] == torchrun[rank]["losses"]
        assert ours[rank]["param_sum"] == torchrun[rank]["param_sum"]
    assert ours[0]["losses"] != ours[1]["losses"]  # each rank really trained on its own shard
    assert ours[0]["param_sum"] == ours[1]["param_sum"]  # and DDP kept them in step


def test_accelerate_detects_the_same_multi_cpu_layout(runs):
    for rank in range(2):
        got = runs["accelerate", "dslaunch"][rank]["detected"]
        assert got == runs["accelerate", "torchrun"][rank]["detected"]
        assert (got["distributed_type"], got["process_index"], got["num_processes"], got["backend"]) == \
            ("DistributedType.MULTI_CPU", rank, 2, "gloo")


def test_lightning_cluster_environment(runs):
    """Under torchrun Lightning picks TorchElasticEnvironment (torch's is_torchelastic_launched():
    TORCHELASTIC_RUN_ID is set). Where dslaunch's ranks carry torchrun's variables they must pick it
    too; without them Lightning falls back to LightningEnvironment, which reads the same RANK /
    WORLD_SIZE / LOCAL_RANK and trains the same (the losses test), but is not what torchrun gives."""
    for rank in range(2):
        ours, torchrun = runs["lightning", "dslaunch"][rank], runs["lightning", "torchrun"][rank]
        assert torchrun["detected"]["cluster_environment"] == "TorchElasticEnvironment"
        layout = {k: v for k, v in ours["detected"].items() if k != "cluster_environment"}
        assert layout == {k: v for k, v in torchrun["detected"].items() if k != "cluster_environment"}
        expected = "TorchElasticEnvironment" if ours["torchelastic_run_id"] else "LightningEnvironment"
        assert ours["detected"]["cluster_environment"] == expected
