"""Dotted top-level config keys (``config/dotted.py``): TRL builds its frozen reference model's
ZeRO-3 engine with ``"zero_optimization.reduce_bucket_size"`` and two more such keys; dslaunch
reads each as the nested key it names (DeepSpeed ignores them), says so once on rank 0, and
refuses only a dotted key that names nothing."""

import json
import subprocess

import pytest

from dslaunch.config import ConfigError, resolve_config
from helpers import DSLAUNCH, ROOT, SCRIPTS, _tails, rank_env

TRL_KEYS = {"zero_optimization.reduce_bucket_size": 32 * 32,
            "zero_optimization.stage3_param_persistence_threshold": 10 * 32,
            "zero_optimization.stage3_prefetch_bucket_size": 0.9 * 32 * 32}


def _resolve(raw):
    return resolve_config(dict({"train_micro_batch_size_per_gpu": 2}, **raw), world_size=2)


def test_dotted_keys_are_read_as_the_nested_keys_they_name():
    raw = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8}, **TRL_KEYS}
    before = json.dumps(raw, sort_keys=True)
    cfg = _resolve(raw)
    zero = cfg.typed.zero_optimization
    assert (zero.reduce_bucket_size, zero.stage3_param_persistence_threshold,
            zero.stage3_prefetch_bucket_size) == (1024, 320, 921)  # 921.6 rounded down
    assert zero.stage == 3  # the nested keys not named stay as written
    assert len(cfg.rewrites) == 3 and "replacing 500000000.0" in cfg.rewrites[0]
    assert cfg.rewrites[0] in cfg.notes  # `dslaunch config show` prints them
    assert json.dumps(raw, sort_keys=True) == before  # the caller's dict is not changed


def test_dotted_key_through_an_alias_and_into_an_absent_section():
    cfg = _resolve({"zero_optimization.stage": 2, "bf16.enabled": True,
                    "zero_optimization.offload_optimizer.device": "cpu"})
    t = cfg.typed
    assert t.zero_optimization.stage == 2 and t.bf16.enabled is True
    assert t.zero_optimization.offload_optimizer.device == "cpu"


@pytest.mark.parametrize("key, hint", [
    ("zero_optimization.reduce_bucket_sise", "did you mean zero_optimization.reduce_bucket_size?"),
    ("zero_optimization.stage.x", "names no config key"),
    ("nothing.here", "write the key nested in its section instead"),
])
def test_dotted_key_that_names_nothing_is_refused(key, hint):
    with pytest.raises(ConfigError) as err:
        _resolve({key: 1})
    assert key in str(err.value) and hint in str(err.value)


@pytest.mark.slow
def test_trl_prepare_deepspeed_builds_its_zero3_reference_engine(tmp_path):
    """TRL's own prepare_deepspeed under --as-deepspeed (tests/scripts/trl_reference_model.py):
    the engine builds, reports each dotted key once, holds the sizes TRL asked for, and its
    loss equals plain PyTorch's on the same tiny GPT-2 (ZeRO-3 gathers the tied head too)."""
    cmd = [*DSLAUNCH, "run", "--as-deepspeed", "--nproc-per-node", "1", "--omp-threads", "1",
           str(SCRIPTS / "trl_reference_model.py"), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, _tails(cmd, proc)
    for key in TRL_KEYS:
        assert proc.stdout.count(f"config: {key}: read as {key} = ") == 1, proc.stdout[-3000:]
    out = json.loads((tmp_path / "result.json").read_text())
    assert out["engine"] == pytest.approx(out["plain"], rel=1e-6)
    assert (out["zero"]["reduce_bucket_size"], out["zero"]["stage3_param_persistence_threshold"],
            out["zero"]["stage3_prefetch_bucket_size"]) == (1024, 320, 921)
