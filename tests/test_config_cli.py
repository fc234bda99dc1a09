"""``dslaunch config validate|show`` through the real console script (and click's runner for the
cheaper variations)."""

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from dslaunch.cli import main

ROOT = Path(__file__).resolve().parents[1]
DSLAUNCH = Path(sys.executable).with_name("dslaunch")


def dslaunch(*args):
    return subprocess.run([str(DSLAUNCH), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_validate_ok_through_the_real_cli():
    out = dslaunch("config", "validate", "configs/gpt_grad_accum.json", "--world-size", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("configs/gpt_grad_accum.json: OK (world size 2: train_batch_size=32, "
                                  "micro=4, grad_accum=4)")


def test_validate_reports_every_problem_and_exits_1(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"zero_optimisation": {}, "train_batch_size": 32,
                                "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                "fp16": {"enabled": True, "initial_scale_power": "x"}}))
    out = dslaunch("config", "validate", str(path), "--world-size", "2")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert f"{path}: zero_optimisation: unknown key; did you mean zero_optimization?" in lines
    assert f'{path}: fp16.initial_scale_power: "x" is not allowed; expected an integer in [0, 64]' in lines
    assert any("train_batch_size=32" in line and "gradient_accumulation_steps=2" in line
               and "world size 2" in line for line in lines)
    assert lines[-1] == f"{path}: 3 problems"


def test_validate_without_world_size_says_what_depends_on_it():
    result = invoke("config", "validate", "configs/gpt_small.json")
    assert result.exit_code == 0
    assert "no --world-size given" in result.output
    assert "train_batch_size depends on the world size: 4 * 1 * data-parallel size" in result.output


def test_validate_not_supported_yet(tmp_path):
    path = tmp_path / "hybrid.yaml"
    path.write_text("train_micro_batch_size_per_gpu: 2\nhybrid_engine:\n  enabled: true\n")
    result = invoke("config", "validate", str(path), "--world-size", "2")
    assert result.exit_code == 1
    assert result.output.strip() == (f"{path}: hybrid_engine.enabled: not supported yet "
                                     "(the hybrid (RLHF) engine: generate with the model "
                                     "itself or an inference server; see docs/porting.md, "
                                     "'Config sections dslaunch refuses'; not planned yet)")


def test_missing_file_and_bad_yaml_are_one_line_errors(tmp_path):
    out = dslaunch("config", "validate", str(tmp_path / "nope.json"))
    assert out.returncode == 1 and out.stderr.strip() == f"{tmp_path / 'nope.json'}: no such config file"
    bad = tmp_path / "bad.yaml"
    bad.write_text("train_batch_size: 8\noptimizer: [unclosed\n")
    out = dslaunch("config", "show", str(bad))
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"{bad}:3:") and "invalid YAML" in line


def test_bad_world_size_is_a_usage_error():
    result = invoke("config", "validate", "configs/gpt_small.json", "--world-size", "0")
    assert result.exit_code == 2 and "--world-size" in result.output


def test_show_json_marks_where_each_value_came_from():
    out = dslaunch("config", "show", "configs/gpt_small_bf16.yaml", "--world-size", "4", "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["values"]["train_batch_size"] == 16 and shown["values"]["bf16"]["enabled"] is True
    sources = shown["sources"]
    assert sources["train_batch_size"] == "inferred"
    assert sources["train_micro_batch_size_per_gpu"] == "file"
    assert sources["bf16.enabled"] == "file" and sources["fp16.enabled"] == "default"
    assert set(sources.values()) <= {"file", "default", "inferred", "auto"}


def test_show_auto_values(tmp_path):
    path = tmp_path / "hf.json"
    path.write_text(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
                                "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}}))
    result = invoke("config", "show", str(path), "--world-size", "2", "--json", "--no-defaults")
    assert result.exit_code == 0, result.output
    sources = json.loads(result.output)["sources"]
    assert sources == {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "file",
                       "gradient_accumulation_steps": "auto", "bf16.enabled": "auto"}


def test_show_table():
    result = invoke("config", "show", "configs/gpt_fp16.json", "--world-size", "2")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 3}
    assert "8" in rows["train_batch_size"] and "inferred" in rows["train_batch_size"]
    assert "true" in rows["fp16.enabled"] and "file" in rows["fp16.enabled"]
    assert "default" in rows["zero_optimization.stage"]
