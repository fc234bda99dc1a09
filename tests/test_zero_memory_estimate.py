"""The memory planner: the ZeRO paper's formulas, and the estimate-memory command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dslaunch.cli.estimate_memory import estimate_memory
from dslaunch.engine.zero.memory_estimate import all_estimates, estimate

PSI, N = 1_000_000, 4  # Ψ divisible by N: no padding


@pytest.mark.parametrize("stage,expected", [
    # stage 0: the paper's 16Ψ + 2Ψ, the fp32 gradient buffer stage0.py accumulates into
    (0, 18 * PSI), (1, 4 * PSI + 12 * PSI // N), (2, 2 * PSI + 14 * PSI // N), (3, 16 * PSI // N)])
def test_mixed_precision_adam_is_the_papers_accounting(stage, expected):
    for precision in ("bf16", "fp16"):
        e = estimate(PSI, N, stage, precision)
        assert e.device == expected and e.cpu == 0


@pytest.mark.parametrize("stage,expected", [
    (0, 16 * PSI), (1, 8 * PSI + 8 * PSI // N), (2, 4 * PSI + 12 * PSI // N), (3, 16 * PSI // N)])
def test_fp32_adam(stage, expected):
    assert estimate(PSI, N, stage, "fp32").device == expected


def test_offload_moves_optimizer_states_and_grad_shard_to_cpu():
    e = estimate(PSI, N, 2, "bf16", offload_optimizer=True)
    assert e.device == 2 * PSI  # only the bf16 params stay
    assert e.cpu == 12 * PSI // N + 4 * PSI // N  # fp32 master+m+v, fp32 grad shard
    e3 = estimate(PSI, N, 3, "bf16", offload_optimizer=True, offload_param=True)
    assert e3.device == 0 and e3.cpu == 2 * PSI // N + 16 * PSI // N
    e1 = estimate(PSI, N, 1, "fp32", offload_optimizer=True)
    assert e1.device == 8 * PSI  # params + full grads
    assert e1.cpu == 4 * PSI // N * 4  # master param shard, m, v, grad shard


def test_shards_round_up_like_the_padded_buffers():
    assert estimate(10, 4, 3, "fp32").params["device"] == 4 * 3


def test_bad_combinations_are_rejected():
    with pytest.raises(ValueError, match="stage 1, 2 or 3"):
        estimate(PSI, N, 0, offload_optimizer=True)
    with pytest.raises(ValueError, match="stage 3"):
        estimate(PSI, N, 2, offload_param=True)
    with pytest.raises(ValueError, match="offload_param must be one of"):
        estimate(PSI, N, 3, offload_param="disk")
    assert len(all_estimates(PSI, N)) == 12


def test_nvme_moves_states_and_params_off_the_host():
    """ZeRO-Infinity: optimizer nvme = CPU offload with Adam's two states (8Ψ/N) and the fp32
    master shard (4Ψ/N) on the drive, the fp32 gradient shard still on the host; param nvme puts
    the parameter shard on the drive instead of the host."""
    for precision, p in (("bf16", 2), ("fp32", 4)):
        cpu = estimate(PSI, N, 3, precision, "cpu", "cpu")
        nvme = estimate(PSI, N, 3, precision, "nvme", "nvme")
        assert nvme.device == cpu.device == 0
        assert nvme.optimizer == {"device": 0, "cpu": 0, "nvme": 12 * PSI // N}
        assert nvme.params == {"device": 0, "cpu": 0, "nvme": p * PSI // N}
        assert cpu.cpu - nvme.cpu == nvme.nvme == (12 + p) * PSI // N
        assert nvme.cpu == nvme.grads["cpu"] == 4 * PSI // N  # only the fp32 gradient shard
        assert nvme.label() == "stage 3 + offload_optimizer=nvme + offload_param=nvme"
    # fp32 without optimizer offload: the parameters on the drive need an fp32 master on device
    plain, pn = estimate(PSI, N, 3, "fp32"), estimate(PSI, N, 3, "fp32", offload_param="nvme")
    assert pn.device - plain.device == 0 and pn.nvme == 4 * PSI // N
    assert pn.optimizer["device"] - plain.optimizer["device"] == 4 * PSI // N
    assert estimate(PSI, N, 2, "bf16", True).offload_optimizer == "cpu"  # the older spelling


def test_hpz_adds_a_secondary_shard_and_mics_partitions_within_its_group():
    """hpZ h: p·Ψ/h more parameter bytes on the device (even with offload_param: backward
    gathers from it there); MiCS s: N becomes s in the stage-3 formulas."""
    plain = estimate(PSI, 8, 3, "bf16")
    hpz = estimate(PSI, 8, 3, "bf16", hpz_partition_size=2)
    assert hpz.params["device"] - plain.params["device"] == 2 * PSI // 2
    assert hpz.device - plain.device == 2 * PSI // 2 and "hpZ 2" in hpz.label()
    off = estimate(PSI, 8, 3, "bf16", "cpu", "cpu", hpz_partition_size=2)
    assert off.params == {"device": PSI, "cpu": 2 * PSI // 8, "nvme": 0}
    assert estimate(PSI, 8, 3, "bf16", mics_shard_size=4).device == estimate(PSI, 4, 3).device
    with pytest.raises(ValueError, match="stage 3"):
        estimate(PSI, 8, 2, hpz_partition_size=2)
    with pytest.raises(ValueError, match="does not divide"):
        estimate(PSI, 8, 3, mics_shard_size=3)


def test_cli_reads_hpz_and_mics_from_the_config(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"bf16": {"enabled": True},
                               "zero_optimization": {"stage": 3, "mics_shard_size": 2}}))
    r = CliRunner().invoke(estimate_memory, ["--params", "1M", "--world-size", "4", "--config",
                                             str(cfg), "--stage", "3", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["estimates"]
    assert all(e["mics_shard_size"] == 2 for e in rows)
    assert [e["per_rank"]["device"] for e in rows if e["config"]] == [16 * PSI // 2]
    r = CliRunner().invoke(estimate_memory, ["--params", "1M", "--world-size", "4", "--stage",
                                             "3", "--hpz-partition-size", "2"])
    assert r.exit_code == 0 and "stage 3 + hpZ 2" in r.output


def test_cli_json_per_rank_and_per_host():
    r = CliRunner().invoke(estimate_memory, ["--params", "1M", "--world-size", "4",
                                             "--ranks-per-host", "2", "--json", "--stage", "1"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["params"] == PSI and out["precision"] == "bf16"
    plain = [e for e in out["estimates"] if e["offload_optimizer"] == "none"][0]
    assert plain["per_rank"]["device"] == 4 * PSI + 12 * PSI // 4
    assert plain["per_host"]["device"] == 2 * plain["per_rank"]["device"]


def test_cli_table_and_errors(tmp_path):
    r = CliRunner().invoke(estimate_memory, ["--params", "1.3B", "--world-size", "8"])
    assert r.exit_code == 0 and "stage 3 + offload_optimizer=cpu + offload_param=cpu" in r.output
    r = CliRunner().invoke(estimate_memory, ["--params", "lots", "--world-size", "8"])
    assert r.exit_code == 2 and "not a parameter count" in r.output
    r = CliRunner().invoke(estimate_memory, ["--params", "1M", "--world-size", "2", "--stage", "1",
                                             "--offload-param", "cpu"])
    assert r.exit_code == 2 and "no stage matches" in r.output


def test_cli_model_script_and_config(tmp_path):
    script = tmp_path / "m.py"
    script.write_text("import torch\n"
                      "def build_model():\n"
                      "    return torch.nn.Linear(1000, 1000)\n")  # 1,001,000 params
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "bf16": {"enabled": True},
                               "zero_optimization": {"stage": 2,
                                                     "offload_optimizer": {"device": "cpu"}}}))
    r = CliRunner().invoke(estimate_memory, ["--model-script", str(script), "--world-size", "2",
                                             "--config", str(cfg), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["params"] == 1_001_000 and out["precision"] == "bf16"
    marked = [e for e in out["estimates"] if e["config"]]
    assert [(e["stage"], e["offload_optimizer"]) for e in marked] == [(2, "cpu")]
    cfg.write_text(json.dumps({"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"},
        "offload_param": {"device": "nvme", "nvme_path": "/x"}}}))
    r = CliRunner().invoke(estimate_memory, ["--params", "1M", "--world-size", "2",
                                             "--config", str(cfg), "--offload-param", "nvme"])
    assert r.exit_code == 0, r.output
    assert "stage 3 + offload_optimizer=nvme + offload_param=nvme" in r.output
    assert r.output.count("<- config") == 1 and "per rank nvme" in r.output


def test_console_script_is_registered():
    exe = Path(sys.executable).with_name("dslaunch")
    out = subprocess.run([str(exe), "estimate-memory", "--params", "27M", "--world-size", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "stage 2" in out.stdout
