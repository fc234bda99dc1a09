"""A ZeRO-3 checkpoint's size on disk, and every reader of its weight-less ``model_states.pt``.

Size: a 2-rank stage-3 fp32 AdamW job (tests/scripts/zero_train.py, the GPT of examples/gpt.py
at d_model 64) saves one checkpoint. The bound comes from the layout in its rank files: each
rank holds its chunk of every bucket (buckets padded to a multiple of the world size) three
times in fp32 (master, exp_avg, exp_avg_sq): 12 bytes x padded elements; ``model_states.pt``
adds only placeholders, buffers and counters. Allowed beyond that: ``OVERHEAD`` bytes per file
for the pickle / zip framing, layout metadata and RNG states (measured: about 9 KB for
model_states.pt, 23 KB per rank file). So the whole checkpoint is under 13 bytes per parameter;
before, model_states.pt also held the gathered fp32 weights (16 bytes per parameter).

Readers (single process, world size 1, a model with a tied weight): ``dslaunch ckpt to-fp32``,
the standalone ``zero_to_fp32.py``, ``load_checkpoint`` into stage 3 (own shard), stage 0/2
(whole weights), a forward-only stage-3 engine, and ``load_module_only`` (optimizer state
untouched) all see the trained weights exactly.
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT, dslaunch

sys.path.insert(0, str(ROOT))
import dslaunch as ds
from dslaunch.engine.checkpoint.zero3_module import PARTITIONED

OVERHEAD = 32 * 1024  # bytes per file beyond the tensors' data (measured 9-23 KB)
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}}


def _config(stage=3, **zero):
    z = {"stage": stage, "reduce_bucket_size": 20000, **zero}
    if stage == 3:
        z.setdefault("stage3_param_persistence_threshold", 0)
    return {"train_batch_size": 16, "gradient_accumulation_steps": 2, "optimizer": ADAMW,
            "gradient_clipping": 0.5, "steps_per_print": 1000, "zero_optimization": z}


def _tag_dir(ck: Path) -> Path:
    return ck / (ck / "latest").read_text().strip()


@pytest.mark.slow
def test_zero3_fp32_adam_checkpoint_is_12_bytes_per_parameter_plus_framing(job_cache):
    job = job_cache.run("z3_size", "zero_train.py", "--steps", 2, "--out", "{dir}/out.json",
                        "--save", "{dir}/ck", "--save-at", 2, "--d-model", 64,
                        config=_config(), nproc=2, timeout=240)
    numel = job.json()["numel"]
    d = _tag_dir(job.dir / "ck")
    ranks = [torch.load(d / f"rank_{r}_optim_states.pt", weights_only=True) for r in range(2)]
    layout = ranks[0]["strategy"]["zero"]["groups"]
    padded = sum(b["numel"] for g in layout for b in g["layout"]["buckets"])
    assert numel <= padded <= numel + 2 * sum(len(g["layout"]["buckets"]) for g in layout)
    for r in ranks:  # what the bound assumes: fp32 master + two fp32 moments per element
        for g in r["strategy"]["zero"]["groups"]:
            assert g["master"].dtype == torch.float32
            assert sorted(g["state"]) == ["exp_avg", "exp_avg_sq"]
    model = torch.load(d / "model_states.pt", weights_only=True)
    part = model[PARTITIONED]
    assert len(part) == len(model["module"]) and all(model["module"][k].numel() == 0
                                                       for k in part)
    assert sum(math.prod(shape) for _, shape in part.values()) == numel
    files = sorted(p for p in d.iterdir() if p.suffix == ".pt")
    sizes = {p.name: p.stat().st_size for p in files}
    bound = 12 * padded + OVERHEAD * len(files)
    assert sizes["model_states.pt"] <= OVERHEAD, sizes
    assert sum(sizes.values()) <= bound, (sizes, bound)
    per_param = sum(sizes.values()) / numel
    assert per_param < 13, (per_param, sizes)  # the old layout: >= 16


# -- readers of a weight-less model_states.pt (single process) -----------------------------------

class Tied(torch.nn.Module):
    """An embedding whose weight is also the output head's (two state_dict keys, one parameter),
    and a buffer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 24)
        self.mid = torch.nn.Linear(24, 24)
        self.head = torch.nn.Linear(24, 64, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("gain", torch.tensor([1.5]))

    def forward(self, x, y):
        h = torch.tanh(self.mid(self.emb(x))) * self.gain
        return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _engine(config, seed=1, optimizer=True):
    torch.manual_seed(seed)
    model = Tied()
    cfg = dict(config, train_batch_size=2, gradient_accumulation_steps=1)
    if not optimizer:
        cfg.pop("optimizer")
    engine, *_ = ds.initialize(model=model, config=cfg)
    return engine


def _train(engine, steps):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, 64, (2, 6), generator=g)
        loss = engine(x, x.roll(1, 1))
        engine.backward(loss)
        engine.step()


def _weights(engine) -> dict:
    """The engine's whole weights, fp32 (stage 3 gathers them)."""
    return {k: v.float() for k, v in engine.strategy.module_state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k].float(), b[k].float()) for k in a)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A stage-3 checkpoint of the tied model after 3 steps, and the weights it trained."""
    d = tmp_path_factory.mktemp("z3tied")
    e = _engine(_config())
    _train(e, 3)
    e.save_checkpoint(d / "ck")
    return d / "ck", _weights(e)


def test_model_states_hold_placeholders_and_name_the_tied_key(saved):
    ck, trained = saved
    model = torch.load(_tag_dir(ck) / "model_states.pt", weights_only=True)
    part = model[PARTITIONED]
    assert part["head.weight"][0] == part["emb.weight"][0] == "emb.weight"
    assert part["head.weight"][1] == [64, 24]
    assert all(model["module"][k].numel() == 0 for k in part)
    assert torch.equal(model["module"]["gain"], torch.tensor([1.5]))  # buffers stay whole
    assert not trained["head.weight"].equal(_engine(_config())
                                            .strategy.module_state_dict()["head.weight"])


def test_to_fp32_and_standalone_script_rebuild_the_trained_weights(saved, tmp_path):
    ck, trained = saved
    p = dslaunch("ckpt", "to-fp32", ck, tmp_path / "a.pt")
    assert p.returncode == 0, p.stdout + p.stderr
    s = subprocess.run([sys.executable, str(ck / "zero_to_fp32.py"), str(ck),
                        str(tmp_path / "b.pt")], capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stdout + s.stderr
    for f in ("a.pt", "b.pt"):
        assert _same(torch.load(tmp_path / f, weights_only=True), trained), f


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_load_checkpoint_gives_the_trained_weights_at_any_stage(saved, stage):
    ck, trained = saved
    e = _engine(_config(stage), seed=5)
    e.load_checkpoint(ck, load_optimizer_states=stage != 0)  # stage 0 takes weights only
    assert e.global_steps == 3
    assert _same(_weights(e), trained)


def test_forward_only_stage3_engine_loads_the_weights(saved):
    ck, trained = saved
    e = _engine(_config(), seed=5, optimizer=False)
    e.load_checkpoint(ck, load_optimizer_states=False)
    assert _same(_weights(e), trained)


def test_load_module_only_keeps_the_optimizer_state(saved):
    ck, trained = saved
    e = _engine(_config(), seed=5)
    _train(e, 2)
    opt = e.strategy.optimizer
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in opt.state}
    e.load_checkpoint(ck, load_module_only=True)
    assert _same(_weights(e), trained) and e.global_steps == 2
    after = {id(p): opt.state[p] for p in opt.state}
    assert sorted(before) == sorted(after)
    assert all(torch.equal(before[i][k], after[i][k]) for i in before for k in before[i])
