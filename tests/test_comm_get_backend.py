"""``dslaunch.comm.get_backend()`` answers one backend name, the accelerator's: "nccl" where the
default device is CUDA, "gloo" on the CPU, also for a group torch reports in its per-device form
("cpu:gloo,cuda:nccl", which dslaunch's NCCL groups are: engine/comm/collectives.py ``with_cpu_backend``).
DeepSpeed initialises with the accelerator's ``communication_backend_name()`` alone, so its
``cdb.get_backend()`` (deepspeed/comm/torch.py: torch's answer) says "nccl" on a GPU."""

import subprocess
import sys
import textwrap

from dslaunch.engine.comm.api import backend_name
from helpers import ROOT, rank_env


def test_per_device_form_maps_to_the_default_devices_backend():
    assert backend_name("cpu:gloo,cuda:nccl", "cuda") == "nccl"
    assert backend_name("cpu:gloo,cuda:nccl", "cpu") == "gloo"
    assert backend_name("cuda:nccl,cpu:gloo", "cuda") == "nccl"
    assert backend_name("cpu:gloo", "cpu") == "gloo"
    assert backend_name("cpu:gloo", "cuda") == "gloo"  # a device the form does not name: first
    for plain in ("gloo", "nccl", "mpi"):
        assert backend_name(plain, "cuda") == plain and backend_name(plain, "cpu") == plain


def test_real_gloo_groups_answer_gloo_on_cpu():
    """A real gloo process group (one process), and a group torch reports as "cpu:gloo"."""
    code = textwrap.dedent("""
        import torch.distributed as dist
        import dslaunch.comm as comm
        comm.init_distributed()
        g = dist.new_group([0], backend="cpu:gloo")
        print("torch", str(dist.get_backend()), str(dist.get_backend(g)))
        print("ours", comm.get_backend(), comm.get_backend(g), type(comm.get_backend()).__name__)
        dist.destroy_process_group()
    """)
    env = rank_env(None)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["torch"] == "gloo cpu:gloo"  # torch's own answer is the per-device form
    assert lines["ours"] == "gloo gloo str"
