"""bf16 on a CPU without native bf16 instructions (no avx512_bf16 / amx_bf16): one warning on
rank 0 before the first step, and a line in ``dslaunch report``, naming the missing flags and the
measured cost (benchmarks/bench_cpu_bf16.py). The detection is a pure function of the flags
(kernels/cpu_features.py: native_bf16, slow_bf16_message), checked here with given flag sets;
the job test expects what this machine's own flags say. Never timing."""

import json

import pytest

from dslaunch.cli.report import bf16_note, collect, render
from dslaunch.kernels.cpu_features import (
    BF16_COST,
    cpu_info,
    native_bf16,
    slow_bf16_message,
    slow_bf16_warning,
)
from helpers import dslaunch

AVX2_ONLY = {"sse4_2", "avx", "avx2", "fma", "f16c"}
AVX512_NO_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def test_detection_from_flag_sets():
    assert native_bf16(AVX2_ONLY, "x86_64") is False
    assert native_bf16(AVX512_NO_BF16, "x86_64") is False
    assert native_bf16(AVX512_NO_BF16 | {"avx512_bf16"}, "x86_64") is True
    assert native_bf16(AVX2_ONLY | {"amx_bf16", "amx_tile"}, "x86_64") is True
    assert native_bf16({"asimd"}, "aarch64") is False
    assert native_bf16({"asimd", "bf16"}, "aarch64") is True
    assert native_bf16(set(), "riscv64") is None  # no claim about an unknown architecture


def test_message_names_missing_flags_cost_and_advice():
    msg = slow_bf16_message(AVX2_ONLY, "x86_64", "Some CPU")
    assert "Some CPU" in msg and "avx512_bf16" in msg and "amx_bf16" in msg and "avx2" in msg
    assert f"{BF16_COST['ratio']:.0f}x slower than fp32" in msg
    assert "fp32" in msg and "AMX" in msg
    for native in (AVX512_NO_BF16 | {"avx512_bf16"}, AVX2_ONLY | {"amx_bf16"}):
        assert slow_bf16_message(native, "x86_64", "Some CPU") is None
    assert slow_bf16_message(set(), "riscv64", "x") is None
    assert "bf16" in slow_bf16_message({"asimd"}, "aarch64", "Arm CPU")


def test_report_only_when_the_cpu_is_the_device():
    assert bf16_note(AVX2_ONLY, "x86_64", "c", cuda_available=True) is None
    assert bf16_note(AVX2_ONLY | {"avx512_bf16"}, "x86_64", "c", cuda_available=False) is None
    note = bf16_note(AVX2_ONLY, "x86_64", "c", cuda_available=False)
    assert note == slow_bf16_message(AVX2_ONLY, "x86_64", "c")
    info = collect()
    info["cpu"]["bf16_warning"] = note
    assert "bf16 on CPU" in render(info) and "avx512_bf16" in render(info)
    info["cpu"]["bf16_warning"] = None
    assert "bf16 on CPU" not in render(info)


def test_report_on_this_machine():
    info = collect()
    cpu = cpu_info()
    want = None if info["cuda"]["available"] else slow_bf16_warning()
    assert info["cpu"]["bf16_warning"] == want
    assert info["cpu"]["native_bf16"] == native_bf16(cpu.flags, cpu.arch)
    proc = dslaunch("report", "--json")
    assert json.loads(proc.stdout)["cpu"]["bf16_warning"] == want
    assert ("bf16 on CPU" in dslaunch("report").stdout) == (want is not None)


def _log_of(job_cache, name, cfg):
    job = job_cache.run(name, "nonfinite_grad.py", "--out", "{dir}/out", "--steps", "1",
                        "--nan-step", "-1", config=cfg, nproc=2, timeout=180)
    return job.log


@pytest.fixture(scope="module")
def logs(job_cache):
    base = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    runs = {"bf16warn-fp32": base, "bf16warn-bf16": dict(base, bf16={"enabled": True})}
    # fp32 first, then bf16, in the same rank processes: the warning is the bf16 run's own
    job_cache.run_many("bf16warn", "nonfinite_grad.py", {
        n: (("--out", "{dir}/out", "--steps", "1", "--nan-step", "-1"), c)
        for n, c in runs.items()}, nproc=2, timeout=180)
    return {n: _log_of(job_cache, n, c) for n, c in runs.items()}


def test_bf16_job_warns_once_on_rank0_before_the_first_step(logs):
    expected = slow_bf16_warning()
    assert "bf16 on a CPU without native bf16" not in logs["bf16warn-fp32"]
    log = logs["bf16warn-bf16"]
    if expected is None:  # this CPU computes bf16 natively: nothing to say
        assert "bf16 on a CPU without native bf16" not in log
        return
    lines = log.splitlines()
    warned = [i for i, line in enumerate(lines) if expected in line]
    assert len(warned) == 1, log  # once, rank 0 only
    assert "[Rank 0]" in lines[warned[0]] and "WARNING" in lines[warned[0]]
    first_step = min(i for i, line in enumerate(lines) if "nonfinite_grad: step 0 done" in line)
    assert warned[0] < first_step
