"""Conformance sweep: real DeepSpeed client scripts under DeepSpeed and under dslaunch.

Each client (a DeepSpeedExamples training script, a snippet that does what one of DeepSpeed's
tutorials types, or a Hugging Face / Lightning trainer with a DeepSpeed config) runs twice, one
run at a time:

    deepspeed  <peer venv python> -m torch.distributed.run --standalone --nproc-per-node N SCRIPT ARGS
    dslaunch   <this venv>/dslaunch run --as-deepspeed --nproc-per-node N SCRIPT ARGS

The script is the same file in both runs (unmodified: `import deepspeed` is DeepSpeed in the peer
venv and dslaunch under --as-deepspeed), both on CPU with gloo. A run passes when it exits 0 and
prints the losses the client prints (its own log lines, parsed with the client's pattern). Where
both pass, the table gives the largest absolute difference between the two runs' losses, step by
step (the losses are what the script prints, so their resolution is the script's: cifar prints 3
decimals).

DeepSpeedExamples scripts are read from a checkout (a work tree or a bare git repository:
``--examples`` or ``DSLAUNCH_DEEPSPEED_EXAMPLES``) into a scratch directory at run time, with the
mechanical edits listed per client below (no downloads: tiny seeded synthetic data instead of
CIFAR-10; CPU: no ``torch.cuda`` calls; shorter runs). Each edit must match the original text
exactly the number of times given, so an upstream change shows as "edit no longer applies"
instead of a silently different script. Tutorial snippets live in
``benchmarks/conformance_clients/`` (each names the tutorial page it follows); ``--deepspeed-docs``
(or ``DSLAUNCH_DEEPSPEED_DOCS``: DeepSpeed's ``docs/_tutorials``, a directory or ``REPO:PATH`` of a
git repository) only checks that those pages exist.

    python benchmarks/conformance.py --examples PATH [--only GLOB,...] [--sides deepspeed,dslaunch]
                                     [--list] [--keep DIR] [--out FILE] [--timeout-scale X]

Output: the table on stdout and JSON in ``benchmarks/results/conformance-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLIENTS_DIR = HERE / "conformance_clients"
RESULTS = HERE / "results"

# ----------------------------------------------------------------------------------- the clients


@dataclass
class Edit:
    """Replace ``old`` (a regular expression when ``regex``) by ``new`` in ``path``; it must match
    exactly ``count`` times in the original."""

    old: str
    new: str
    reason: str  # "no-download: ...", "cpu: ...", "short: ...", "compare: ..."
    count: int = 1
    regex: bool = False
    path: str = ""  # the client's script when empty


@dataclass
class Client:
    name: str
    kind: str  # "example" | "tutorial" | "framework"
    script: str  # examples: path in DeepSpeedExamples; else a file in conformance_clients/
    args: list = field(default_factory=list)
    nproc: int = 2
    files: list = field(default_factory=list)  # more files of the example's tree it needs
    edits: list = field(default_factory=list)
    loss: str = r"loss[=:] *([-\d.]+(?:e[-+]?\d+)?)"  # one group: a printed loss
    timeout: int = 300
    needs: list = field(default_factory=list)  # modules both venvs must have
    source: str = ""  # the tutorial page (docs/_tutorials/NAME.md) or the framework's doc
    note: str = ""


# cifar: 64 train / 40 test images of CIFAR-10's shapes whose classes are learnable
SYNTHETIC_CIFAR = '''
def _synthetic_cifar10(n, seed):  # conformance edit (no download): CIFAR-10's shapes
    g = torch.Generator().manual_seed(1234)
    patterns = torch.rand(10, 3, 32, 32, generator=g) * 2 - 1
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    images = (0.6 * patterns[labels] + 0.4 * torch.randn(n, 3, 32, 32, generator=g)).clamp(-1, 1)
    return torch.utils.data.TensorDataset(images, labels)
'''

CIFAR_EDITS = [
    Edit("import torchvision\nfrom torchvision import transforms\n", "",
         "no-download: torchvision's CIFAR10 downloads 170 MB; a seeded synthetic dataset of its "
         "shapes (10 learnable classes) replaces it"),
    Edit("\n\ndef add_argument():", "\n" + SYNTHETIC_CIFAR + "\n\ndef add_argument():",
         "no-download: the synthetic dataset, defined after the imports"),
    Edit(r"    transform = transforms\.Compose\(\n.*?\n    \)\n", "    transform = None\n",
         "no-download: the transforms belong to the torchvision dataset", regex=True),
    Edit(r"trainset = torchvision\.datasets\.CIFAR10\(\n.*?\n    \)",
         "trainset = _synthetic_cifar10(64, seed=1)", "no-download: synthetic train set",
         regex=True),
    Edit(r"testset = torchvision\.datasets\.CIFAR10\(\n.*?\n    \)",
         "testset = _synthetic_cifar10(40, seed=2)", "no-download: synthetic test set",
         regex=True),
    Edit("    net = Net(args)\n", "    torch.manual_seed(0)\n    net = Net(args)\n",
         "compare: the original leaves the initial weights unseeded; the two runs must start "
         "from the same weights for their losses to be compared"),
]
CIFAR_LOSS = r"\[ *\d+, +\d+\] loss: +([-\d.]+)"
CIFAR_ARGS = ["--epochs", "2", "--log-interval", "1"]

PIPE_DIR = "training/pipeline_parallelism/"
SYNTHETIC_PIPE = '''
def _synthetic_cifar10_224(n=64):  # conformance edit (no download): the transformed shapes
    g = torch.Generator().manual_seed(1234)
    patterns = torch.rand(10, 3, 224, 224, generator=g) * 2 - 1
    labels = torch.arange(n) % 10
    images = 0.6 * patterns[labels] + 0.4 * torch.randn(n, 3, 224, 224, generator=g)
    return torch.utils.data.TensorDataset(images, labels)
'''
PIPE_EDITS = [
    Edit("import torchvision\nfrom torchvision import transforms\nfrom torchvision.models import "
         "AlexNet\nfrom torchvision.models import vgg19\n",
         "from alexnet import AlexNet\n",
         "no-download: torchvision is not installed; AlexNet comes from the example's own "
         "alexnet.py (its header says train.py can import it from there), vgg19 is unused"),
    Edit("\n\ndef cifar_trainset(", "\n" + SYNTHETIC_PIPE + "\n\ndef cifar_trainset(",
         "no-download: the synthetic dataset, defined after the imports"),
    Edit(r"    trainset = torchvision\.datasets\.CIFAR10\(.*?\)\n",
         "    trainset = _synthetic_cifar10_224()\n",
         "no-download: 64 synthetic 3x224x224 images (the shape Resize(256)+CenterCrop(224) "
         "gives) instead of CIFAR-10", regex=True),
    Edit(r"    transform = transforms\.Compose\(\[\n.*?\n    \]\)\n", "",
         "no-download: the transforms belong to the torchvision dataset", regex=True),
    Edit("    torch.cuda.set_device(args.local_rank)\n",
         "    if torch.cuda.is_available():\n        torch.cuda.set_device(args.local_rank)\n",
         "cpu: no CUDA device to select"),
    Edit('"train_batch_size" : 256', '"train_batch_size" : 16', "short: 16 samples a step (2 "
         "micro-batches of 8) instead of 256, so a step takes seconds on a CPU",
         path=PIPE_DIR + "ds_config.json"),
    Edit('"steps_per_print" : 10', '"steps_per_print" : 1',
         "short: the run has fewer than 10 steps; print every step's loss",
         path=PIPE_DIR + "ds_config.json"),
]
# train_batch's per-step line: DeepSpeed's pipeline engine and dslaunch's print it differently
PIPE_LOSS = r"(?:steps: +\d+ loss: |\[dslaunch\] step +\d+ loss )([-\d.]+)"
PIPE_BASE_LOSS = r"step: +\d+ / +\d+ loss: (?:tensor\()?([-\d.]+)"  # train_base's own print

BF16_DIR = "training/bf16_master_weight/"
BF16_EDITS = [
    Edit("    torch.cuda.set_device(local_rank)\n",
         "    if torch.cuda.is_available():\n        torch.cuda.set_device(local_rank)\n",
         "cpu: no CUDA device to select"),
    Edit("    torch.cuda.reset_peak_memory_stats()\n",
         "    if torch.cuda.is_available():\n        torch.cuda.reset_peak_memory_stats()\n",
         "cpu: CUDA memory statistics do not exist on a CPU-only torch"),
]
BF16_ARGS = ["--hidden_dim", "64", "--num_layers", "2", "--num_heads", "2", "--vocab_size", "256",
             "--seq_length", "32", "--num_steps", "6", "--log_interval", "1"]
BF16_LOSS = r"\[Rank 0\] Step \d+: loss=([-\d.]+)"

NO_LOSS = r"(?!)"  # a client that trains nothing: passing is exiting 0
# what the snippets print (dslaunch's launcher prefixes a rank's lines with "[rank N] "; the
# engine's own "[dslaunch] step N loss" lines are not the script's)
TRAIN_LOSS = r"(?m)^(?:\[rank \d+\] )?step +\d+ loss ([-\d.]+(?:e[-+]?\d+)?)"


def clients() -> list:
    ex = "training/cifar/cifar10_deepspeed.py"
    out = [
        Client("cifar-fp32", "example", ex, ["--dtype", "fp32", *CIFAR_ARGS], edits=CIFAR_EDITS,
               loss=CIFAR_LOSS),
        Client("cifar-bf16", "example", ex, ["--dtype", "bf16", *CIFAR_ARGS], edits=CIFAR_EDITS,
               loss=CIFAR_LOSS),
        Client("cifar-fp16", "example", ex, ["--dtype", "fp16", *CIFAR_ARGS], edits=CIFAR_EDITS,
               loss=CIFAR_LOSS, note="the script's default dtype"),
        Client("cifar-bf16-zero1", "example", ex, ["--dtype", "bf16", "--stage", "1", *CIFAR_ARGS],
               edits=CIFAR_EDITS, loss=CIFAR_LOSS),
        Client("cifar-bf16-zero2", "example", ex, ["--dtype", "bf16", "--stage", "2", *CIFAR_ARGS],
               edits=CIFAR_EDITS, loss=CIFAR_LOSS),
        Client("cifar-bf16-zero3", "example", ex, ["--dtype", "bf16", "--stage", "3", *CIFAR_ARGS],
               edits=CIFAR_EDITS, loss=CIFAR_LOSS),
        # run_ds_moe.sh's flags (2 experts, expert parallel over both ranks, top-1, RSample)
        Client("cifar-moe", "example", ex,
               ["--dtype", "fp32", *CIFAR_ARGS, "--deepspeed", "--moe", "--ep-world-size", "2",
                "--num-experts", "2", "--top-k", "1", "--noisy-gate-policy", "RSample",
                "--moe-param-group"], edits=CIFAR_EDITS, loss=CIFAR_LOSS,
               note="run_ds_moe.sh's MoE flags with --dtype fp32"),
        # run_ds_prmoe.sh: pyramid-residual MoE (2 layers of 2 and 4 experts, residual)
        Client("cifar-prmoe", "example", ex,
               ["--dtype", "fp32", *CIFAR_ARGS, "--deepspeed", "--moe", "--ep-world-size", "2",
                "--num-experts", "2", "4", "--top-k", "1", "--mlp-type", "residual",
                "--noisy-gate-policy", "RSample", "--moe-param-group"],
               edits=CIFAR_EDITS, loss=CIFAR_LOSS, note="run_ds_prmoe.sh's flags, 2 ranks"),
        Client("pipeline-p2", "example", PIPE_DIR + "train.py",
               ["--deepspeed_config=ds_config.json", "-p", "2", "--steps=4", "--backend", "gloo"],
               files=[PIPE_DIR + "alexnet.py", PIPE_DIR + "ds_config.json"], edits=PIPE_EDITS,
               loss=PIPE_LOSS, timeout=420, note="run.sh's command, 4 steps, gloo"),
        Client("pipeline-p0", "example", PIPE_DIR + "train.py",
               ["--deepspeed_config=ds_config.json", "-p", "0", "--steps=10", "--backend", "gloo"],
               files=[PIPE_DIR + "alexnet.py", PIPE_DIR + "ds_config.json"], edits=PIPE_EDITS,
               loss=PIPE_BASE_LOSS, timeout=420,
               note="the data-parallel path (-p 0), 10 steps: the script prints step 10's loss"),
    ]
    for cfg in ("baseline", "bf16_full"):
        for ckpt in ((), ("--activation_checkpointing",)):
            out.append(Client(
                f"bf16_master_weight-{cfg}" + ("-ckpt" if ckpt else ""), "example",
                BF16_DIR + "train.py",
                [*BF16_ARGS, "--deepspeed_config", f"configs/{cfg}.json", *ckpt],
                files=[BF16_DIR + f"configs/{cfg}.json"], edits=BF16_EDITS, loss=BF16_LOSS,
                note="run_comparison.sh's command on a tiny model"))
    # run_benchmark.sh's command on a small model: ZeRO-3 offload_states / reload_states
    out.append(Client("offload_states", "example", "training/offload_states/offload_states.py",
                      ["--hidden_dim", "64", "--nlayers", "2", "--iteration", "3", "--warmup",
                       "1"], loss=NO_LOSS,
                      note="prints memory, not losses: passing is exiting 0 (its own asserts "
                           "check that offloading frees memory and reloading takes it back)"))
    t = "tutorial"
    out += [
        Client("tut-getting-started", t, "getting_started.py",
               ["--deepspeed", "--deepspeed_config", "getting_started.json"],
               files=["getting_started.json", "_tiny.py"], loss=TRAIN_LOSS,
               source="getting-started.md"),
        Client("tut-zero3-init", t, "zero3_init.py",
               ["--deepspeed", "--deepspeed_config", "zero3.json"],
               files=["zero3.json", "_tiny.py"], loss=TRAIN_LOSS, source="zero.md"),
        Client("tut-zero-offload", t, "train_config.py",
               ["--deepspeed", "--deepspeed_config", "zero_offload.json"],
               files=["zero_offload.json", "_tiny.py"], loss=TRAIN_LOSS,
               source="zero-offload.md"),
        Client("tut-pipeline", t, "pipeline.py",
               ["--deepspeed", "--deepspeed_config", "pipeline.json"],
               files=["pipeline.json", "_tiny.py"], loss=TRAIN_LOSS, source="pipeline.md"),
        Client("tut-moe", t, "moe.py", ["--deepspeed", "--deepspeed_config", "moe.json"],
               files=["moe.json", "_tiny.py"], loss=TRAIN_LOSS,
               source="mixture-of-experts.md"),
        Client("tut-flops-profiler", t, "flops_profiler.py",
               ["--deepspeed", "--deepspeed_config", "flops_profiler.json"],
               files=["flops_profiler.json", "_tiny.py"], loss=TRAIN_LOSS,
               source="flops-profiler.md"),
        Client("tut-comms-logging", t, "comms_logging.py",
               ["--deepspeed", "--deepspeed_config", "comms_logging.json"],
               files=["comms_logging.json", "_tiny.py"], loss=TRAIN_LOSS,
               source="comms-logging.md"),
        Client("tut-monitor", t, "monitor.py",
               ["--deepspeed", "--deepspeed_config", "monitor.json"],
               files=["monitor.json", "_tiny.py"], loss=TRAIN_LOSS, source="monitor.md"),
        Client("tut-activation-checkpointing", t, "activation_checkpointing.py",
               ["--deepspeed", "--deepspeed_config", "activation_checkpointing.json"],
               files=["activation_checkpointing.json", "_tiny.py"], loss=TRAIN_LOSS,
               source="megatron.md"),
        Client("tut-one-cycle", t, "train_config.py",
               ["--deepspeed", "--deepspeed_config", "one_cycle.json"],
               files=["one_cycle.json", "_tiny.py"], loss=TRAIN_LOSS, source="one-cycle.md"),
        Client("tut-lrrt", t, "train_config.py",
               ["--deepspeed", "--deepspeed_config", "lrrt.json"],
               files=["lrrt.json", "_tiny.py"], loss=TRAIN_LOSS, source="lrrt.md"),
        Client("tut-deepnvme", t, "deepnvme.py", [], nproc=1, loss=NO_LOSS,
               source="deepnvme.md"),
    ]
    f = "framework"
    out += [
        Client("hf-trainer-zero2", f, "hf_trainer.py", ["--deepspeed", "hf_zero2.json"],
               files=["hf_zero2.json"], loss=TRAIN_LOSS, needs=["transformers", "accelerate"],
               source="transformers: Trainer(args=TrainingArguments(deepspeed=...))"),
        Client("hf-trainer-zero3", f, "hf_trainer.py", ["--deepspeed", "hf_zero3.json"],
               files=["hf_zero3.json"], loss=TRAIN_LOSS, needs=["transformers", "accelerate"],
               source="transformers: Trainer with ZeRO-3 (model built under zero.Init)"),
        Client("accelerate-plugin-zero2", f, "accelerate_plugin.py", [], nproc=1,
               loss=TRAIN_LOSS, needs=["accelerate"],
               source="accelerate: Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))"),
        Client("lightning-strategy", f, "lightning_strategy.py", [], loss=TRAIN_LOSS,
               needs=["lightning"], source="lightning: Trainer(strategy=DeepSpeedStrategy(stage=2))"),
        Client("trl-sft-zero2", f, "trl_sft.py", ["--deepspeed", "hf_zero2.json"],
               files=["hf_zero2.json"], loss=TRAIN_LOSS, needs=["trl", "transformers", "datasets"],
               source="trl: SFTTrainer(args=SFTConfig(deepspeed=...))"),
    ]
    return out


# ------------------------------------------------------------------------------- materializing


class Examples:
    """A DeepSpeedExamples checkout: a work tree, or a bare git repository (read at HEAD)."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.bare = not (self.path / "training").is_dir()
        if self.bare and subprocess.run(["git", "-C", str(self.path), "rev-parse", "HEAD"],
                                        capture_output=True).returncode != 0:
            raise SystemExit(f"--examples {path}: neither a work tree nor a git repository")

    def read(self, rel: str) -> str:
        if not self.bare:
            return (self.path / rel).read_text()
        return subprocess.run(["git", "-C", str(self.path), "show", f"HEAD:{rel}"],
                              capture_output=True, text=True, check=True).stdout

    def revision(self) -> str:
        proc = subprocess.run(["git", "-C", str(self.path), "rev-parse", "HEAD"],
                              capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def apply_edits(text: str, edits: list, path: str) -> str:
    """The original text (line ends normalized) with the edits meant for ``path``."""
    text = text.replace("\r\n", "\n")
    for e in edits:
        if (e.path or "") != path:
            continue
        pattern = e.old if e.regex else re.escape(e.old)
        found = len(re.findall(pattern, text, flags=re.S))
        if found != e.count:
            raise ValueError(f"edit no longer applies to {path} ({found} matches, expected "
                             f"{e.count}): {e.old[:60]!r}")
        text = re.sub(pattern, lambda _m, new=e.new: new, text, flags=re.S)
    return text


def materialize(client: Client, examples, work: Path) -> Path:
    """Write the client's files into ``work``; returns the script's path there."""
    work.mkdir(parents=True, exist_ok=True)
    if client.kind != "example":
        for name in [client.script, *client.files]:
            shutil.copy(CLIENTS_DIR / name, work / name)
        return work / client.script
    if examples is None:
        raise ValueError("needs a DeepSpeedExamples checkout (--examples)")
    base = client.script.rsplit("/", 1)[0] + "/"
    for rel in [client.script, *client.files]:
        key = "" if rel == client.script else rel
        text = apply_edits(examples.read(rel), client.edits, key)
        dest = work / rel[len(base):]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    return work / client.script[len(base):]


# ------------------------------------------------------------------------------------- running


def dslaunch_argv() -> list:
    exe = Path(sys.executable).with_name("dslaunch")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dslaunch"]


def command(side: str, client: Client, script: Path, peer_py: str | None) -> list:
    n = str(client.nproc)
    if side == "deepspeed":
        return [peer_py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n,
                script.name, *client.args]
    return [*dslaunch_argv(), "run", "--as-deepspeed", "--nproc-per-node", n, script.name,
            *client.args]


def run_env(side: str, threads: int, peer_py: str | None = None) -> dict:
    env = dict(os.environ)
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "DSLAUNCH_AS_DEEPSPEED", "PYTHONPATH"):
        env.pop(k, None)
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    if side == "dslaunch":  # this checkout's dslaunch, whatever the venv has
        env["PYTHONPATH"] = str(REPO)
    elif peer_py and "TORCH_EXTENSIONS_DIR" not in env:
        # DeepSpeed JIT-builds its CPU ops (deepspeed_shm_comm at init) under a lock in the
        # shared torch extensions cache: another DeepSpeed job on the machine rebuilding them
        # holds every run of the sweep at initialize. The sweep keeps its own cache, in the venv.
        env["TORCH_EXTENSIONS_DIR"] = str(Path(os.path.dirname(os.path.dirname(peer_py)))
                                          / "torch_extensions")
    return env


def _descendants(pid: int) -> list:
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a launcher and every process under it (ranks may start sessions of their own)."""
    for p in [pid, *_descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def has_modules(python: str, modules: list, env: dict) -> str:
    """'' when ``python`` imports every module, else the first that fails."""
    for m in modules:
        probe = subprocess.run([python, "-c", f"import {m}"], capture_output=True, env=env)
        if probe.returncode != 0:
            return m
    return ""


def error_line(log: str) -> str:
    """The most telling line of a failed run's log: the last exception raised."""
    lines = [ln.strip() for ln in log.splitlines()]
    for ln in reversed(lines):  # a rank's own exception, as torchrun prefixes it
        if re.match(r"\[rank\d+\]: [\w.]*(Error|Exception)\b", ln):
            return re.sub(r"^\[rank\d+\]: ", "", ln)[:400]
    for ln in lines:  # dslaunch's summary of the first failing rank
        if re.search(r"rank \d+ \(host \S+\) exited with code", ln):
            return ln[:400]
    for ln in reversed(lines):
        if re.search(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception|Exit)\b.*?:", ln) \
                and "Traceback" not in ln:
            return re.sub(r"^\[rank\d+\]: ", "", ln)[:400]
    for ln in reversed(lines):
        if re.search(r"error|failed|exited", ln, re.I):
            return ln[:400]
    return (lines[-1] if lines else "")[:400]


def run_side(side: str, client: Client, work: Path, peer_py, threads: int, scale: float) -> dict:
    script = work / Path(client.script).name if client.kind != "example" else \
        work / client.script.rsplit("/", 1)[-1]
    cmd = command(side, client, script, peer_py)
    env = run_env(side, threads, peer_py)
    res = {"command": shlex.join(cmd)}
    python = peer_py if side == "deepspeed" else sys.executable
    missing = has_modules(python, client.needs, env)
    if missing:
        return {**res, "passed": False, "status": "missing module",
                "error": f"{missing} is not installed in the {side} venv", "losses": []}
    t0 = time.time()
    log_path = work / f"{side}.log"
    with open(log_path, "w") as logf:
        # its own session, so that a timeout ends the launcher and every rank it started
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=client.timeout * scale)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            rc = "timeout"
    log = log_path.read_text(errors="replace")
    wall = time.time() - t0
    losses = [float(v) for v in re.findall(client.loss, log)]
    passed = rc == 0 and (bool(losses) or client.loss == NO_LOSS)
    status = "ok" if passed else ("timeout" if rc == "timeout" else
                                  f"exit {rc}" if rc != 0 else "no loss printed")
    res.update(passed=passed, status=status, returncode=rc, wall_seconds=round(wall, 1),
               losses=losses)
    if not passed:
        res["error"] = (f"timed out after {client.timeout * scale:.0f} s, {len(losses)} losses "
                        f"printed; last line: {error_line(log)}") if rc == "timeout" \
            else error_line(log)
        res["log_tail"] = log[-2500:]
    return res


def agreement(a: list, b: list) -> dict:
    if not a or not b:
        return {}
    if len(a) != len(b):
        n = min(len(a), len(b))
        out = {"note": f"{len(a)} vs {len(b)} losses printed; compared the first {n}"}
        a, b = a[:n], b[:n]
    else:
        out = {}
    diffs = [abs(x - y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    out["max_abs_diff"] = max(diffs) if diffs else float("nan")
    out["n"] = len(a)
    return out


def run_client(client: Client, sides: list, examples, keep: Path, peer_py, threads, scale):
    row = {"client": client.name, "kind": client.kind, "script": client.script,
           "args": client.args, "nproc": client.nproc, "source": client.source,
           "note": client.note, "edits": [{"path": e.path or client.script, "reason": e.reason}
                                          for e in client.edits]}
    work = keep / client.name
    if work.exists():
        shutil.rmtree(work)
    try:
        materialize(client, examples, work)
    except (ValueError, subprocess.CalledProcessError, OSError) as exc:
        row["skipped"] = str(exc)
        return row
    for side in sides:
        if side == "deepspeed" and not peer_py:
            row[side] = {"passed": None, "status": "no peer venv", "losses": []}
            continue
        row[side] = run_side(side, client, work, peer_py, threads, scale)
        # a second run of one side must start from the same files (checkpoints, logs removed)
        materialize(client, examples, work)
    # compared wherever both printed losses (a run that hangs at exit after training still has)
    if all(row.get(s, {}).get("losses") for s in ("deepspeed", "dslaunch")):
        row["loss_agreement"] = agreement(row["deepspeed"]["losses"], row["dslaunch"]["losses"])
    return row


# --------------------------------------------------------------------------------------- table


def _mark(side: dict | None) -> str:
    if not side:
        return "-"
    if side.get("passed") is None:
        return side.get("status", "-")
    return "yes" if side["passed"] else "NO"


def table(rows: list) -> str:
    head = ("client", "deepspeed", "dslaunch", "loss max|diff| (n)")
    lines = []
    for r in rows:
        if "skipped" in r:
            lines.append((r["client"], "skipped", "skipped", r["skipped"][:60]))
            continue
        ag = r.get("loss_agreement") or {}
        agree = "" if not ag else (f"{ag['max_abs_diff']:.3g} ({ag['n']})"
                                   if ag["max_abs_diff"] == ag["max_abs_diff"] else "nan")
        if ag.get("note"):
            agree += " *"
        lines.append((r["client"], _mark(r.get("deepspeed")), _mark(r.get("dslaunch")), agree))
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(4)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*x) for x in lines]
    fails = [(r["client"], s, r[s]) for r in rows for s in ("deepspeed", "dslaunch")
             if isinstance(r.get(s), dict) and r[s].get("passed") is False]
    if fails:
        out.append("")
        out += [f"{c} [{s}]: {d.get('error', d['status'])}" for c, s, d in fails]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- main


def docs_check(docs: str | None, selected: list) -> dict:
    """Which tutorial pages the snippets name exist in the given DeepSpeed docs."""
    if not docs:
        return {}
    out = {}
    for c in selected:
        if c.kind != "tutorial" or not c.source:
            continue
        if ":" in docs and not Path(docs).exists():
            repo, sub = docs.split(":", 1)
            ok = subprocess.run(["git", "-C", repo, "cat-file", "-e",
                                 f"HEAD:{sub.rstrip('/')}/{c.source}"],
                                capture_output=True).returncode == 0
        else:
            ok = (Path(docs) / c.source).is_file()
        out[c.source] = ok
    return out


def report(path: Path) -> int:
    result = json.loads(path.read_text())
    known = {c.name: c for c in clients()}
    for row in result["clients"]:
        for side in ("deepspeed", "dslaunch"):
            log = Path(result["scratch"]) / row["client"] / f"{side}.log"
            run = row.get(side)
            if isinstance(run, dict) and log.exists() and row["client"] in known:
                # the losses as the client's current pattern reads them
                run["losses"] = [float(v) for v in re.findall(
                    known[row["client"]].loss, log.read_text(errors="replace"))]
            if isinstance(run, dict) and run.get("passed") is False and log.exists():
                text = log.read_text(errors="replace")
                run["error"] = error_line(text) if run.get("status") != "timeout" else \
                    f"timed out, {len(run.get('losses', []))} losses printed; last line: " \
                    f"{error_line(text)}"
        row.pop("loss_agreement", None)
        if all((row.get(s) or {}).get("losses") for s in ("deepspeed", "dslaunch")):
            row["loss_agreement"] = agreement(row["deepspeed"]["losses"],
                                              row["dslaunch"]["losses"])
    path.write_text(json.dumps(result, indent=1))
    print(table(result["clients"]))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", default=os.environ.get("DSLAUNCH_DEEPSPEED_EXAMPLES"),
                   help="DeepSpeedExamples checkout (work tree or git repository); "
                        "env DSLAUNCH_DEEPSPEED_EXAMPLES")
    p.add_argument("--deepspeed-docs", default=os.environ.get("DSLAUNCH_DEEPSPEED_DOCS"),
                   help="DeepSpeed's docs/_tutorials (a directory, or REPO:docs/_tutorials of a "
                        "git repository); env DSLAUNCH_DEEPSPEED_DOCS")
    p.add_argument("--only", default="", help="comma-separated client names or globs")
    p.add_argument("--sides", default="deepspeed,dslaunch")
    p.add_argument("--peer-python", default=None, help="the DeepSpeed venv's python "
                   "(default: benchmarks/peers.py's venv, created if missing)")
    p.add_argument("--keep", default=None, help="scratch directory kept after the run")
    p.add_argument("--out", default=None, help="JSON path (default results/conformance-TS.json)")
    p.add_argument("--threads", type=int, default=1, help="OMP threads per rank")
    p.add_argument("--timeout-scale", type=float, default=1.0)
    p.add_argument("--list", action="store_true", help="list the clients and their edits")
    p.add_argument("--report", default=None, metavar="JSON",
                   help="print the table of an earlier run's JSON again (error lines re-read "
                        "from its kept scratch directory when it is still there)")
    args = p.parse_args(argv)
    if args.report:
        return report(Path(args.report))

    selected = clients()
    if args.only:
        pats = [x.strip() for x in args.only.split(",") if x.strip()]
        selected = [c for c in selected if any(fnmatch.fnmatch(c.name, x) for x in pats)]
    if args.list:
        for c in selected:
            print(f"{c.name} [{c.kind}] {c.script} {' '.join(c.args)}"
                  + (f"  ({c.source})" if c.source else ""))
            for e in c.edits:
                print(f"    edit {e.path or c.script}: {e.reason}")
        return 0
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not selected:
        print("no client selected", file=sys.stderr)
        return 2
    examples = Examples(args.examples) if args.examples else None
    peer_py = None
    if "deepspeed" in sides:
        peer_py = os.path.abspath(args.peer_python) if args.peer_python else None
        if not peer_py:
            sys.path.insert(0, str(HERE))
            from peers import peer_python

            peer_py = peer_python(create=True)
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="conformance-"))
    keep.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else \
        RESULTS / f"conformance-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    versions = {}
    if peer_py:
        v = subprocess.run([peer_py, "-c", "import deepspeed, torch; print(deepspeed.__version__,"
                            " torch.__version__)"], capture_output=True, text=True)
        versions["deepspeed_venv"] = v.stdout.strip()
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "examples_revision": examples.revision() if examples else None,
              "sides": sides, "versions": versions, "threads_per_rank": args.threads,
              "docs_pages_found": docs_check(args.deepspeed_docs, selected),
              "scratch": str(keep), "clients": []}
    rows = result["clients"]
    for c in selected:
        print(f"[conformance] {c.name} ...", file=sys.stderr, flush=True)
        row = run_client(c, sides, examples, keep, peer_py, args.threads, args.timeout_scale)
        rows.append(row)
        print(f"[conformance] {c.name}: deepspeed {_mark(row.get('deepspeed'))}, dslaunch "
              f"{_mark(row.get('dslaunch'))} {row.get('loss_agreement', '')}", file=sys.stderr,
              flush=True)
        out.write_text(json.dumps(result, indent=1))  # after every client: a stopped sweep keeps
    print(table(rows))
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")
    if not args.keep:
        shutil.rmtree(keep, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
