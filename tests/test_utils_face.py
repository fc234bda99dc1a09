"""dslaunch.utils and dslaunch.checkpoint (DeepSpeed's ``deepspeed.utils`` and
``deepspeed.checkpoint``).

End to end on real 2-rank gloo jobs through `dslaunch run` (tests/scripts/utils_face.py: the tiny
GPT, ZeRO stage 0 fp32, 1 bf16, 2 fp32, 3 bf16, 3 fp32 with Blocks as leaf modules; buckets
small enough that parameters straddle the ranks' chunks), checked against oracles that do not go
through the code under test: ``p.grad`` (stage 0), stage 0's gradients (same weights and data at
step 0), the checkpoint's consolidation (``dslaunch ckpt to-fp32``) and its rank files read with
the checkpoint room's own index. Also the ``zero_to_fp32.py`` written beside the checkpoints,
run by a Python that cannot import dslaunch, and the groups of a tensor-parallel pipeline job.
In-process (one rank, no launcher): the logger, RepeatingLoader, clone_tensors_for_torch_save,
leaf-module marking and stage 3's unit plan, and the zero_to_fp32 calls' options.
"""

import json
import logging
import os
import subprocess
import sys
from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import dslaunch
from dslaunch.checkpoint.utils import clone_tensors_for_torch_save
from dslaunch.engine.base.partition import Layout
from dslaunch.engine.storage.files import RankFiles
from dslaunch.engine.storage.shard_index import ParamIndex
from dslaunch.utils import (
    RepeatingLoader,
    get_z3_leaf_modules,
    logger,
    safe_get_full_grad,
    set_z3_leaf_modules,
    unset_z3_leaf_modules,
    z3_leaf_module,
    zero_to_fp32,
)
from gpt import GPT, Block, GPTConfig
from helpers import DSLAUNCH, ROOT, JobCache, launch, results

LR = 1e-3
TIGHT = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
         "stage3_prefetch_bucket_size": 5000, "stage3_max_live_parameters": 10000}


def _config(stage, bf16=False, **zero):
    c = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
         "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000, **zero}}
    if bf16:
        c["bf16"] = {"enabled": True}
    return c


RUNS = {"s0": (_config(0), []), "s1": (_config(1, bf16=True), []), "s2": (_config(2), []),
        "s3": (_config(3, bf16=True, **TIGHT), []), "s3leaf": (_config(3, **TIGHT), ["--leaf"])}
_DONE: dict = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("utils_face")


# launched together (JobCache.run_many: one after the other in the same ranks); s0 alone: its
# log is checked line by line (test_log_dist_logs_on_the_ranks_asked_for)
BATCHED = ("s1", "s2", "s3", "s3leaf")


def _args(flags):
    return ("--out", "{dir}/out", "--save-dir", "{dir}/ck", *flags)


def run(work, name):
    """(per-rank records, per-rank values, checkpoint dir, launch output) of a run, once."""
    if name not in _DONE:
        cache = _DONE.setdefault("jobs", JobCache(work / "jobs"))
        if name in BATCHED:
            cache.run_many("utils_face", "utils_face.py",
                           {n: (_args(RUNS[n][1]), RUNS[n][0]) for n in BATCHED}, timeout=300)
        config, flags = RUNS[name]
        job = cache.run(name, "utils_face.py", *_args(flags), config=config, timeout=300)
        out = job.dir / "out"
        values = [torch.load(out / f"rank_{r}_values.pt", weights_only=True) for r in (0, 1)]
        _DONE[name] = (results(out), values, job.dir / "ck", job.log)
    return _DONE[name]


def _to_fp32_cli(ckpt, out, tag):
    proc = subprocess.run(DSLAUNCH + ["ckpt", "to-fp32", str(ckpt), str(out), "--tag", tag],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return torch.load(out, weights_only=True)


def _assert_same(got: dict, want: dict):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def _saved_state(ckpt, tag, key, names):
    """Optimizer state ``key`` per parameter name, read from the rank files with the checkpoint
    room's own index (ZeRO 1-3) or torch's optimizer state_dict (stage 0)."""
    meta = json.loads((ckpt / tag / "metadata.json").read_text())
    files = RankFiles(str(ckpt / tag), meta["world_size"])
    z0 = files.zero(0)
    if z0 is None:  # one parameter group, in the model's order
        state = files.raw(0)["strategy"]["optimizer"]["state"]
        return {n: state[i][key] for i, n in enumerate(names)}
    out = {}
    for gi, g in enumerate(z0["groups"]):
        idx = ParamIndex(Layout.from_meta(g["layout"]))
        for n in idx.names():
            out[n] = idx.gather(lambda k, gi=gi: files.zero(k)["groups"][gi]["state"][key], n)
    return out


# -- logging and groups ---------------------------------------------------------------------------

def test_log_dist_logs_on_the_ranks_asked_for(work):
    log = run(work, "s0")[3]
    assert log.count("[Rank 0] to rank zero") == 1 and "[Rank 1] to rank zero" not in log
    assert "[Rank 0] to every rank" in log and "[Rank 1] to every rank" in log
    assert "to no rank" not in log  # DeepSpeed's rule: ranks=None logs nowhere in a job
    assert "quiet info" not in log  # below the level set with logger.setLevel
    assert "[Rank 0] loud warning" in log and "[Rank 1] loud warning" in log


def test_groups_of_a_plain_data_parallel_job(work):
    for r, rec in enumerate(run(work, "s0")[0]):
        g = rec["groups"]
        for axis in ("data_parallel", "sequence_data_parallel"):
            assert g[axis] == {"world_size": 2, "rank": r, "ranks": [0, 1]}
        for axis in ("model_parallel", "tensor_model_parallel", "pipe_parallel",
                     "sequence_parallel"):  # axes the job lacks: this rank alone
            assert g[axis] == {"world_size": 1, "rank": 0, "ranks": [r]}


def test_groups_of_a_tensor_parallel_pipeline_job_and_its_zero_to_fp32(work):
    """PipelineModule on a 1 x TP 2 grid, bf16: the groups follow its grid; the checkpoint's
    zero_to_fp32.py (pipeline format: TP slices merged, fp32 masters) gives what `dslaunch ckpt
    to-fp32` gives."""
    out, ck = work / "pipe", work / "pipe_ck"
    launch(work, {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                  "optimizer": {"type": "AdamW", "params": {"lr": LR}}, "bf16": {"enabled": True}},
           "pipe_train.py", ["--out", out, "--tp", 2, "--steps", 2, "--save-dir", ck,
                             "--save-at", 2], timeout=300)
    for r, rec in enumerate(results(out)):
        g = rec["groups"]
        assert g["model_parallel"] == {"world_size": 2, "rank": r, "ranks": [0, 1]}
        for axis in ("data_parallel", "pipe_parallel", "sequence_parallel"):
            assert g[axis] == {"world_size": 1, "rank": 0, "ranks": [r]}
    want = _to_fp32_cli(ck, work / "pipe_cli.pt", "global_step2")
    _assert_same(_run_script_isolated(ck, work / "pipe_script.pt"), want)
    _assert_same(zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(ck), want)
    assert any("qkv" in k for k in want)  # a TP-split weight, merged


# -- safe_get / safe_set --------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(RUNS))
def test_full_fp32_params_are_the_checkpointed_weights(work, name):
    """safe_get_full_fp32_param on every rank == the consolidated checkpoint of those weights
    (fp32 masters under bf16), bit for bit; and the zero_to_fp32 call gives the same."""
    _, values, ck, _ = run(work, name)
    want = _to_fp32_cli(ck, work / f"{name}_final.pt", "final")
    for v in values:
        _assert_same(v["fp32"], want)
    _assert_same(zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(ck, tag="final"), want)


@pytest.mark.parametrize("name", list(RUNS))
def test_full_optimizer_states_are_the_checkpointed_ones(work, name):
    _, values, ck, _ = run(work, name)
    names = list(values[0]["fp32"])
    for key in ("exp_avg", "exp_avg_sq"):
        saved = _saved_state(ck, "final", key, names)
        for v in values:
            for n in names:
                assert torch.equal(v["states"][key][n], saved[n].reshape(v["fp32"][n].shape)), n


@pytest.mark.parametrize("name", ["s0", "s2", "s3leaf"])
def test_full_grads_equal_stage0s(work, name):
    """At step 0 every run has the same weights and data: the averaged gradients (fp32) equal
    stage 0's, which equal its p.grad (the oracle). Exactly: one micro-batch per step and two
    ranks, so each element is (a + b) / 2 whichever collective sums it."""
    ref = run(work, "s0")[1][0]
    for n, g in ref["oracle_grads"].items():
        assert torch.equal(ref["grads"][n], g), n
    for v in run(work, name)[1]:
        for n, g in ref["grads"].items():
            assert torch.equal(v["grads"][n], g), n


def test_bf16_grads_are_the_same_in_stage1_and_stage3(work):
    a, b = run(work, "s1")[1][0]["grads"], run(work, "s3")[1][0]["grads"]
    for n in a:
        assert torch.equal(a[n], b[n]), n


@pytest.mark.parametrize("stage", [0, 2])
def test_full_grad_has_the_fp16_loss_scale_divided_out(stage):
    """One rank, in process: the fp16 gradient (loss scale 256) is the fp32 run's, unscaled."""
    grads = {}
    for fp16 in (False, True):
        torch.manual_seed(0)
        model = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))
        config = dict(_config(stage), train_batch_size=2, train_micro_batch_size_per_gpu=2)
        if fp16:
            config["fp16"] = {"enabled": True, "initial_scale_power": 8}
        engine, *_ = dslaunch.initialize(model=model, config=config)
        tokens = torch.arange(16).reshape(2, 8)
        engine.backward(engine(tokens, tokens))
        grads[fp16] = safe_get_full_grad(model.head.weight)
    assert engine.loss_scale == 256
    assert (grads[True] - grads[False]).norm() <= 1e-2 * grads[False].norm()


@pytest.mark.parametrize("name", ["s1", "s2", "s3"])
def test_local_pieces_make_up_the_whole(work, name):
    """safe_get_local_*: rank 0's piece then rank 1's is the whole flat value (rank 0 owns the
    lower part of every bucket); at stage 0 nothing is partitioned (None)."""
    v0, v1 = run(work, name)[1]
    for n, whole in v0["fp32"].items():
        assert torch.equal(torch.cat([v0["local_fp32"][n], v1["local_fp32"][n]]), whole.flatten())
        assert torch.equal(torch.cat([v0["local_grads"][n], v1["local_grads"][n]]),
                           v0["grads"][n].flatten())
        assert torch.equal(torch.cat([v0["local_exp_avg"][n], v1["local_exp_avg"][n]]),
                           v0["states"]["exp_avg"][n].flatten())
    assert 0 < v0["local_fp32"]["tok_emb.weight"].numel() < v0["fp32"]["tok_emb.weight"].numel()
    assert all(x is None for x in run(work, "s0")[1][0]["local_fp32"].values())


@pytest.mark.parametrize("name", list(RUNS))
def test_set_full_values_reach_weights_masters_and_checkpoint(work, name):
    recs, values, ck, _ = run(work, name)
    target = values[0]["set"]
    for rec in recs:
        assert rec["set"]["fp32_back"] and rec["set"]["state_back"]
        assert rec["set"]["weight_is_value_in_dtype"]  # the bf16 copy follows the master
        # the next step starts from the new value: it moves it by about an Adam step
        assert 0 < rec["set"]["moved_max"] <= 3 * LR
    saved = _to_fp32_cli(ck, work / f"{name}_after_set.pt", "after_set")
    assert torch.equal(saved[target["name"]], target["value"])
    state = _saved_state(ck, "after_set", "exp_avg", list(values[0]["fp32"]))[target["name"]]
    assert torch.equal(state.reshape(target["state"].shape), target["state"])


# -- leaf modules ---------------------------------------------------------------------------------

def test_leaf_module_is_gathered_whole_and_trains_the_same(work):
    """Blocks marked leaf: stage 3 plans one unit per Block (none for the modules inside), so all
    of a Block's parameters are whole while its last Linear runs; without the mark only that
    Linear's are. Losses equal stage 2's (fp32, same data)."""
    recs = run(work, "s3leaf")[0]
    assert recs[0]["leaf_marked"] == 2
    assert recs[0]["units"] == ["Block", "Embedding", "LayerNorm", "Linear"]  # ln_f, head
    assert all(all(r["whole_block_in_forward"]) for r in recs)
    plain = run(work, "s3")[0]
    assert "Block" not in plain[0]["units"]
    assert not any(plain[0]["whole_block_in_forward"])
    ref = run(work, "s2")[0][0]["losses"]
    got = recs[0]["losses"]
    assert max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-5


def test_leaf_marking():
    model = GPT(GPTConfig(seq_len=8, n_layer=2, d_model=32, n_head=2))
    assert set_z3_leaf_modules(model, ["MLP"]) == [b.mlp for b in model.blocks]  # by name
    assert get_z3_leaf_modules(model) == [b.mlp for b in model.blocks]
    assert z3_leaf_module(model.blocks[0].mlp) and not z3_leaf_module(model.blocks[0])
    assert unset_z3_leaf_modules(model, [type(model.blocks[0].mlp)]) == [b.mlp for b in
                                                                         model.blocks]
    assert get_z3_leaf_modules(model) == []
    with pytest.raises(ValueError, match="no module of class"):
        set_z3_leaf_modules(model, [torch.nn.Conv2d])
    assert set_z3_leaf_modules(model, [torch.nn.Conv2d], raise_if_not_found=False) == []


def test_stage3_unit_plan_makes_a_leaf_one_unit():
    from dslaunch.engine.zero.stage3_units import plan_units

    model = GPT(GPTConfig(seq_len=8, n_layer=2, d_model=32, n_head=2))
    set_z3_leaf_modules(model, [Block])
    named = [list(model.named_parameters())]
    plan = plan_units(model, named, 2, 1 << 20, 0)
    assert set(plan.fetch) == {model.tok_emb, model.pos_emb, *model.blocks, model.ln_f,
                               model.head}
    for i, b in enumerate(model.blocks):  # one bucket holds all of a Block's parameters
        keys = {plan.key_of[f"blocks.{i}.{n}"] for n, _ in b.named_parameters()}
        assert len(keys) == 1 and plan.fetch[b] == sorted(keys)


# -- in-process: logger, RepeatingLoader, clone_tensors_for_torch_save ----------------------------

def test_logger_is_one_named_logger_whose_level_is_settable():
    assert logger is logging.getLogger("dslaunch")
    assert dslaunch.utils.logging.logger is logger  # DeepSpeed's second spelling
    before = logger.level
    try:
        logger.setLevel(logging.ERROR)
        assert not logger.isEnabledFor(logging.WARNING)
    finally:
        logger.setLevel(before)


def test_repeating_loader_starts_a_new_epoch_when_one_ends():
    epochs = []

    class Loader:
        def __iter__(self):
            epochs.append(len(epochs))
            return iter([1, 2, 3])

    it = RepeatingLoader(Loader())
    assert iter(it) is it
    assert [next(it) for _ in range(8)] == [1, 2, 3, 1, 2, 3, 1, 2]
    assert epochs == [0, 1, 2]
    with pytest.raises(StopIteration):  # an empty loader ends rather than spins
        next(RepeatingLoader([]))


def test_clone_tensors_for_torch_save_copies_tensors_only():
    flat = torch.arange(10.0, requires_grad=True)
    view = flat[2:4]
    Pair = namedtuple("Pair", "a b")
    sd = OrderedDict(w=view, nested={"l": [flat[:1], 7], "t": (flat[5:6], "x")}, p=Pair(view, 1))
    sd._metadata = {"": {"version": 1}}
    out = clone_tensors_for_torch_save(sd)
    assert type(out) is OrderedDict and out._metadata == sd._metadata
    assert torch.equal(out["w"], view) and not out["w"].requires_grad
    assert out["w"].untyped_storage().nbytes() == 2 * 4  # its own elements, not the flat buffer
    assert out["nested"]["l"][1] == 7 and out["nested"]["t"][1] == "x"
    assert isinstance(out["nested"]["t"], tuple) and isinstance(out["p"], Pair)
    out["nested"]["l"][0].add_(100)
    assert flat[0].item() == 0  # a copy
    assert clone_tensors_for_torch_save(view, device="meta").device.type == "meta"


# -- zero_to_fp32: the script beside the checkpoints, and the calls' options ----------------------

def _run_script_isolated(ckpt, out, *flags):
    """Run <ckpt>/zero_to_fp32.py with a Python that cannot import dslaunch: isolated (-I),
    without site (-S: no editable-install hook), only torch's site-packages on sys.path."""
    site = str(Path(torch.__file__).resolve().parents[1])
    boot = ("import importlib.util, runpy, sys; sys.path.append(sys.argv.pop(1)); "
            "assert importlib.util.find_spec('dslaunch') is None, 'dslaunch is importable'; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", boot, site,
                           str(ckpt / "zero_to_fp32.py"), str(ckpt), str(out), *map(str, flags)],
                          cwd=out.parent, capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out / "pytorch_model.bin" if out.is_dir() else out, weights_only=True)


@pytest.mark.parametrize("name", ["s1", "s3"])
def test_zero_to_fp32_script_needs_only_torch(work, name):
    """The script written beside a ZeRO 1 / ZeRO 3 (bf16) checkpoint: the model's fp32 weights
    exactly (tag final), and what `dslaunch ckpt to-fp32` writes (latest)."""
    _, values, ck, _ = run(work, name)
    assert os.access(ck / "zero_to_fp32.py", os.X_OK)
    assert 'WRITTEN_BY = "dslaunch ' + dslaunch.__version__ in (ck / "zero_to_fp32.py").read_text()
    _assert_same(_run_script_isolated(ck, work / f"{name}_s.pt", "--tag", "final"),
                 values[0]["fp32"])
    latest = (ck / "latest").read_text()
    (work / f"{name}_dir").mkdir()
    got = _run_script_isolated(ck, work / f"{name}_dir")  # a directory: pytorch_model.bin
    _assert_same(got, _to_fp32_cli(ck, work / f"{name}_latest.pt", latest))
    assert (work / f"{name}_dir" / "pytorch_model.bin").exists()


def test_zero_to_fp32_calls_and_frozen_parameters(tmp_path):
    """One rank, in process: a frozen parameter is in the checkpoint's state_dict unless
    excluded (the calls and the script alike); convert writes into a directory; load fills a
    fresh model with the weights."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))
    model.pos_emb.weight.requires_grad_(False)
    config = dict(_config(0), train_batch_size=1, train_micro_batch_size_per_gpu=1)
    engine, *_ = dslaunch.initialize(model=model, config=config)
    tok = torch.randint(0, 256, (1, 8))
    engine.backward(engine(tok, tok))
    engine.step()
    engine.save_checkpoint(tmp_path / "ck")
    ck = tmp_path / "ck"
    full = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(ck)
    _assert_same(full, {k: v.detach().float() for k, v in model.state_dict().items()})
    lean = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(ck,
                                                                 exclude_frozen_parameters=True)
    assert set(full) - set(lean) == {"pos_emb.weight"}
    _assert_same(_run_script_isolated(ck, tmp_path / "s.pt", "--exclude_frozen_parameters"), lean)
    (tmp_path / "out").mkdir()
    path = zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(ck, tmp_path / "out")
    assert path == str(tmp_path / "out" / "pytorch_model.bin")
    _assert_same(torch.load(path, weights_only=True), full)
    fresh = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))
    assert zero_to_fp32.load_state_dict_from_zero_checkpoint(fresh, ck) is fresh
    _assert_same(fresh.state_dict(), full)
    with pytest.raises(RuntimeError, match="max_shard_size '5XB'"):
        zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(ck, tmp_path / "x",
                                                                max_shard_size="5XB")
    assert not (tmp_path / "x").exists()


def _script(ckpt, out, *flags, block_safetensors=False):
    """<ckpt>/zero_to_fp32.py run as _run_script_isolated does; the process, not its result.
    ``block_safetensors``: as where the package is not installed (an import of it fails)."""
    site = str(Path(torch.__file__).resolve().parents[1])
    block = "sys.modules['safetensors'] = None; " if block_safetensors else ""
    boot = ("import importlib.util, runpy, sys; sys.path.append(sys.argv.pop(1)); " + block +
            "assert importlib.util.find_spec('dslaunch') is None, 'dslaunch is importable'; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, "-I", "-S", "-c", boot, site,
                           str(ckpt / "zero_to_fp32.py"), str(ckpt), str(out), *map(str, flags)],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1"})


def _read_sharded(out: Path, index_name: str, load) -> dict:
    """The tensors of a sharded output, checked against its Hugging Face index."""
    index = json.loads((out / index_name).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert sorted(p.name for p in out.iterdir()) == sorted(files + [index_name])  # no .part left
    state = {}
    for f in files:
        part = load(out / f)
        assert {n for n, v in index["weight_map"].items() if v == f} == set(part)
        state.update(part)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size()
                                                  for v in state.values())
    return state


def test_zero_to_fp32_safetensors_and_shards(work):
    """ZeRO 3 (bf16) checkpoint, 2 ranks: the script (torch + safetensors only) and the library
    write safetensors and Hugging Face shards + index that hold the model's fp32 weights exactly;
    no safetensors package or a bad size is a clear error."""
    from safetensors.torch import load_file

    _, values, ck, _ = run(work, "s3")
    want = values[0]["fp32"]
    total = sum(v.numel() * 4 for v in want.values())
    limit = total // 3  # at least three shards, none above the limit unless one tensor alone
    proc = _script(ck, work / "st", "-t", "final", "--safe_serialization",
                   "--max_shard_size", str(limit))
    assert proc.returncode == 0, proc.stderr
    index = json.loads((work / "st" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    got = _read_sharded(work / "st", "model.safetensors.index.json", load_file)
    _assert_same(got, want)
    for f in files:
        part = load_file(work / "st" / f)
        assert len(part) == 1 or sum(v.numel() * 4 for v in part.values()) <= limit
    # the library: torch shards (a directory because max_shard_size is given), one safetensors
    path = zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(
        ck, work / "lib_bin", max_shard_size=f"{limit / 1000}KB", tag="final")
    assert path == str(work / "lib_bin" / "pytorch_model.bin.index.json")
    _assert_same(_read_sharded(work / "lib_bin", "pytorch_model.bin.index.json",
                               lambda f: torch.load(f, weights_only=True)), want)
    (work / "lib_one").mkdir()
    path = zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(
        ck, work / "lib_one", safe_serialization=True, tag="final")
    assert path == str(work / "lib_one" / "model.safetensors")
    _assert_same(load_file(path), want)
    # errors: no safetensors, a size that is no size; nothing written
    proc = _script(ck, work / "none.safetensors", "--safe_serialization", block_safetensors=True)
    assert proc.returncode != 0 and "pip install safetensors" in proc.stderr, proc.stderr
    proc = _script(ck, work / "bad", "--max_shard_size", "5XB")
    assert proc.returncode != 0 and "max_shard_size '5XB'" in proc.stderr, proc.stderr
    assert not (work / "none.safetensors").exists() and not (work / "bad").exists()
