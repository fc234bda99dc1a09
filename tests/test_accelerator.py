"""dslaunch.accelerator: the CPU accelerator's answers (names, seeds, RNG state, real process
memory figures with a resettable peak, no-op streams and events, tensor constructors, dtypes, op
builders), the choice and its override (DSLAUNCH_ACCELERATOR / DS_ACCELERATOR), the CUDA class
built and named without a GPU, and 2 ranks under `dslaunch run` whose gloo group is the backend
the accelerator names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dslaunch.accelerator import Accelerator, get_accelerator, real_accelerator, set_accelerator
from dslaunch.accelerator.cpu import CPUAccelerator, ProcessMemory
from dslaunch.accelerator.cuda import CUDAAccelerator

MB = 1 << 20
TENSOR = 25_000_000  # float32 elements: 100 MB
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def acc():
    return CPUAccelerator()


# -- the device ------------------------------------------------------------------------------------


def test_cpu_names_and_device_answers(acc, monkeypatch):
    assert isinstance(acc, Accelerator)
    assert acc.device_name() == acc.device_name(3) == acc.current_device_name() == "cpu"
    assert torch.zeros(1, device=acc.current_device()).device.type == "cpu"
    assert acc.is_available() and acc.communication_backend_name() == "gloo"
    assert acc.is_synchronized_device() and acc.use_host_timers()
    assert acc.resolves_data_dependency() and acc.handles_memory_backpressure()
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert acc.device_count() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert acc.device_count() == 4  # one CPU "device" per rank on this host
    acc.set_device(3)  # a no-op, never an error
    with acc.device(0):
        acc.synchronize()
        acc.synchronize(0)
    assert acc.visible_devices_envs() == []
    env = {"PATH": "/bin"}
    acc.set_visible_devices_envs(env, [0, 1])
    assert env == {"PATH": "/bin"}
    assert "GLOO" in acc.export_envs()
    assert acc.get_compile_backend() == "inductor"
    with pytest.raises(ValueError, match="not registered"):
        acc.set_compile_backend("no-such-backend")
    acc.set_compile_backend("eager")
    assert acc.get_compile_backend() == "eager"
    called = []
    acc.lazy_call(lambda: called.append(1))
    assert called == [1]
    from torch.utils.cpp_extension import BuildExtension

    assert acc.build_extension() is BuildExtension
    acc.range_push("x")
    acc.range_pop()


def test_seeds_reproduce(acc):
    assert acc.random() is torch.random
    acc.manual_seed(1234)
    a = torch.randn(8)
    assert acc.initial_seed() == 1234
    acc.manual_seed_all(1234)
    assert torch.equal(torch.randn(8), a)
    g = acc.default_generator(0)
    assert g is torch.default_generator
    g.manual_seed(1234)
    assert torch.equal(torch.randn(8), a)
    acc.seed()  # a fresh non-deterministic seed
    assert acc.initial_seed() != 1234 or not torch.equal(torch.randn(8), a)


def test_rng_state_round_trips(acc):
    acc.manual_seed(7)
    torch.randn(3)
    state = acc.get_rng_state()
    x = torch.randn(16)
    torch.randn(100)
    acc.set_rng_state(state)
    assert torch.equal(torch.randn(16), x)
    assert torch.equal(acc.get_rng_state(0), acc.get_rng_state())  # the index is ignored


# -- memory ----------------------------------------------------------------------------------------


def _clear_refs_writable() -> bool:
    return os.access("/proc/self/clear_refs", os.W_OK) and os.path.exists("/proc/self/status")


def test_memory_figures_are_the_process_rss_and_its_peak(acc):
    import psutil

    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    assert abs(before - psutil.Process().memory_info().rss) < 16 * MB  # the process's own RSS
    assert acc.max_memory_allocated() < before + 16 * MB  # the reset took the peak down to now
    x = torch.ones(TENSOR)  # written, so resident
    during = acc.memory_allocated()
    assert during - before >= 90 * MB
    assert acc.memory_reserved() >= 90 * MB + before - 16 * MB
    del x
    acc.empty_cache()
    after = acc.memory_allocated()
    assert after < during - 50 * MB  # freed back to the OS (malloc returns a block this big)
    assert acc.max_memory_allocated() >= during - MB  # the peak survives the free ...
    assert acc.max_memory_reserved() >= during - MB
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= during - MB
    assert set(stats) >= {"allocated_bytes.all.current", "allocated_bytes.all.peak",
                          "reserved_bytes.all.current", "reserved_bytes.all.peak"}
    acc.reset_peak_memory_stats()  # ... until the reset
    assert acc.max_memory_allocated() < during - 50 * MB
    assert acc.memory_cached() > 0 and acc.max_memory_cached() > 0
    assert 0 < acc.available_memory() <= acc.total_memory()
    assert acc.total_memory() == psutil.virtual_memory().total


@pytest.mark.skipif(not _clear_refs_writable(), reason="no resettable kernel RSS mark here")
def test_a_peak_between_two_calls_is_not_missed(acc):
    """The kernel's high-water mark sees a tensor that lived only between two of our calls."""
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    x = torch.ones(TENSOR)
    del x
    assert acc.max_memory_allocated() >= before + 90 * MB


def test_peak_fallback_without_proc(monkeypatch):
    """Where /proc cannot be read or written, the peak is the largest RSS seen since the reset,
    or ru_maxrss once the process passes its earlier lifetime peak."""
    monkeypatch.setattr(ProcessMemory, "_STATUS", "/nonexistent/status")
    monkeypatch.setattr(ProcessMemory, "_CLEAR_REFS", "/nonexistent/clear_refs")
    mem = ProcessMemory()
    assert not mem._kernel_peak
    mem.reset()
    base = mem.current()
    x = torch.ones(TENSOR)
    during = mem.current()
    del x
    assert during - base >= 90 * MB
    assert mem.peak() >= during
    mem.reset()
    assert mem.peak() < during - 50 * MB


# -- streams, events -------------------------------------------------------------------------------


def test_streams_and_events_are_no_ops_on_cpu(acc):
    s = acc.Stream()
    s.wait_stream(acc.current_stream())
    s.synchronize()
    assert s.query()
    assert acc.default_stream() is acc.current_stream()
    with acc.stream(s) as entered:
        assert entered is s
    e = acc.Event(enable_timing=True)
    e.record()
    e.record(s)
    s.wait_event(e)
    e.wait()
    e.synchronize()
    assert e.query()
    assert s.record_event().query()
    with pytest.raises(RuntimeError, match="perf_counter"):
        e.elapsed_time(acc.Event(enable_timing=True))


# -- tensors and dtypes ----------------------------------------------------------------------------


def test_tensor_type_properties_make_tensors_on_the_device(acc):
    types = {"BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8,
             "DoubleTensor": torch.float64, "FloatTensor": torch.float32,
             "HalfTensor": torch.float16, "IntTensor": torch.int32, "LongTensor": torch.int64}
    for name, dtype in types.items():
        make = getattr(acc, name)
        assert make is getattr(acc, name)
        t = make([1, 2, 3])  # data
        assert t.dtype == dtype and t.device.type == "cpu" and t.tolist() == [1, 2, 3]
        assert make(2, 5).shape == (2, 5) and make(2, 5).dtype == dtype  # a shape
        assert make(torch.Size([4])).shape == (4,)
        assert make(7).shape == (7,)  # one int is a size, as in the legacy constructors
        assert make().shape == (0,)
        assert isinstance(t, make)
    assert not isinstance(torch.ones(2, dtype=torch.int64), acc.FloatTensor)
    assert not isinstance([1.0], acc.FloatTensor)
    converted = acc.HalfTensor(torch.arange(3))
    assert converted.dtype == torch.float16 and converted.tolist() == [0, 1, 2]
    assert acc.FloatTensor([1.0], requires_grad=True).requires_grad
    with pytest.raises(TypeError, match="accelerator's device"):
        acc.FloatTensor([1.0], device="meta")


def test_dtype_answers(acc):
    assert acc.is_bf16_supported() and acc.is_fp16_supported()
    assert acc.supported_dtypes() == [torch.float32, torch.bfloat16, torch.float16]
    assert not acc.is_triton_supported()
    # the answers hold: both low precisions run forward and backward here
    for dtype in (torch.bfloat16, torch.float16):
        w = torch.randn(8, 8, dtype=dtype, requires_grad=True)
        (w @ w).sum().backward()
        assert w.grad.dtype == dtype and torch.isfinite(w.grad.float()).all()
    assert acc.amp() is torch.cpu.amp
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with acc.autocast(dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
    with acc.autocast(enabled=False):
        assert (a @ b).dtype == torch.float32


def test_pinning_is_copy_free_on_cpu(acc):
    t = torch.ones(4)
    assert acc.pin_memory(t) is t
    assert acc.pin_memory(t, align_bytes=4096) is t
    assert acc.is_pinned(t) and acc.on_accelerator(t)
    assert not acc.on_accelerator(torch.ones(1, device="meta"))


# -- compiled ops ----------------------------------------------------------------------------------


def test_op_builders_name_dslaunch_ops(acc):
    cls = acc.get_op_builder("CPUAdamBuilder")
    assert cls.NAME == "cpu_adam" and cls.KIND == "cpu" and cls.__name__ == "CPUAdamBuilder"
    assert acc.get_op_builder("CPUAdamBuilder") is cls
    assert acc.get_op_builder("cpu_lion").NAME == "cpu_lion"  # our own op names work too
    assert acc.create_op_builder("AsyncIOBuilder").name == "async_io"
    assert acc.get_op_builder("FusedAdamBuilder") is None  # a CUDA op: not on this device
    assert acc.get_op_builder("TransformerBuilder") is None  # an op dslaunch does not have
    assert acc.create_op_builder("TransformerBuilder") is None
    builder = acc.create_op_builder("CPUAdamBuilder")
    assert builder.sources() == ["cpu/cpu_adam.cpp"]
    if not builder.is_compatible():
        pytest.skip("cpu_adam cannot be built here")
    from dslaunch.kernels import load_op

    module = builder.load(verbose=False)
    assert module is load_op("cpu_adam") and hasattr(module, "adam")


# -- the choice ------------------------------------------------------------------------------------


def test_get_accelerator_is_one_object_and_set_accelerator_replaces_it():
    first = get_accelerator()
    assert get_accelerator() is first
    import dslaunch

    assert dslaunch.get_accelerator is get_accelerator  # from deepspeed import get_accelerator
    mine = CPUAccelerator()
    try:
        set_accelerator(mine)
        assert get_accelerator() is mine
    finally:
        set_accelerator(first)
    with pytest.raises(TypeError, match="Accelerator"):
        set_accelerator("cpu")


def test_the_choice_and_its_override(monkeypatch):
    monkeypatch.delenv("DSLAUNCH_ACCELERATOR", raising=False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    if not torch.cuda.is_available():
        assert type(real_accelerator.choose()) is CPUAccelerator
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU is seen
        assert type(real_accelerator.choose()) is CUDAAccelerator
        monkeypatch.undo()
    monkeypatch.setenv("DSLAUNCH_ACCELERATOR", "CPU")  # the override beats the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert type(real_accelerator.choose()) is CPUAccelerator
    monkeypatch.setenv("DSLAUNCH_ACCELERATOR", "tpu")
    with pytest.raises(ValueError, match="DSLAUNCH_ACCELERATOR='tpu'"):
        real_accelerator.choose()
    monkeypatch.delenv("DSLAUNCH_ACCELERATOR")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # DeepSpeed's variable is honoured too
    assert type(real_accelerator.choose()) is CPUAccelerator
    monkeypatch.setenv("DSLAUNCH_ACCELERATOR", "cuda")  # ours wins over DeepSpeed's
    assert type(real_accelerator.choose()) is CUDAAccelerator


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_requested_without_a_gpu_is_a_clear_error():
    env = dict(os.environ, DSLAUNCH_ACCELERATOR="cuda")
    r = subprocess.run([sys.executable, "-c",
                        "from dslaunch.accelerator import get_accelerator; get_accelerator()"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "RuntimeError: DSLAUNCH_ACCELERATOR=cuda but" in r.stderr
    env["DSLAUNCH_ACCELERATOR"] = "cpu"
    code = ("from dslaunch.accelerator import get_accelerator; "
            "print(type(get_accelerator()).__name__)")
    r = subprocess.run([sys.executable, "-c", code],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "CPUAccelerator", r.stderr


def test_cuda_accelerator_builds_and_names_without_a_gpu():
    cuda = CUDAAccelerator()
    assert isinstance(cuda, Accelerator) and repr(cuda).startswith("<dslaunch CUDAAccelerator")
    assert cuda.device_name() == "cuda" and cuda.device_name(2) == "cuda:2"
    assert cuda.communication_backend_name() == "nccl"
    assert not cuda.is_synchronized_device() and not cuda.use_host_timers()
    assert cuda.is_available() == torch.cuda.is_available()
    assert cuda.visible_devices_envs() == ["CUDA_VISIBLE_DEVICES"]
    assert cuda.export_envs() == ["NCCL"]
    env = {}
    cuda.set_visible_devices_envs(env, [0, 2])
    assert env == {"CUDA_VISIBLE_DEVICES": "0,2"}
    assert cuda.Stream is torch.cuda.Stream and cuda.Event is torch.cuda.Event
    assert cuda.amp() is torch.cuda.amp
    assert cuda.get_compile_backend() == "inductor"
    assert not isinstance(torch.ones(1), cuda.FloatTensor)  # a CPU tensor is not a CUDA one
    assert cuda.on_accelerator(torch.ones(1)) is False
    assert cuda.get_op_builder("FusedAdamBuilder").NAME == "cuda_fused_adam"
    assert cuda.get_op_builder("CPUAdamBuilder").NAME == "cpu_adam"  # offload runs on the host


# -- 2 ranks ---------------------------------------------------------------------------------------


def test_two_ranks_init_distributed_uses_the_accelerators_backend():
    env = dict(os.environ, DSLAUNCH_ACCELERATOR="cpu")
    cli = "import sys; from dslaunch.cli import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", cli, "run", "--nproc-per-node", "2",
                        str(SCRIPTS / "accelerator_rank.py")],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert (f"accel rank={rank} kind=cpu backend=gloo accel_backend=gloo device_count=2 "
                f"device=cpu sum=3") in r.stdout, r.stdout + r.stderr
