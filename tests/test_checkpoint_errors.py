"""Missing, corrupt and mismatched checkpoints give one clear error naming the file or tensor
(single-process engine, world size 1)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import dslaunch
from dslaunch.engine.storage.files import CheckpointError
from gpt import GPT, GPTConfig

CFG = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def _engine(d_model=32):
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=d_model, n_head=2))
    engine, *_ = dslaunch.initialize(model=model, config=dict(CFG))
    return engine


def _train(engine, steps=1):
    tok = torch.randint(0, 256, (2, 8))
    for _ in range(steps):
        loss = engine(tok, tok)
        engine.backward(loss)
        engine.step()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    e = _engine()
    _train(e)
    e.save_checkpoint(d, client_state={"epoch": 7})
    return d


def test_round_trip_single_process(saved):
    e = _engine()
    path, client = e.load_checkpoint(saved)
    assert path.endswith("global_step1") and client == {"epoch": 7} and e.global_steps == 1


def test_missing_dir_latest_and_tag(tmp_path, saved):
    """Nothing to resume from (no `latest`, no tag) is DeepSpeed's (None, None) and a warning;
    a tag that is named but missing is an error."""
    e = _engine()
    for empty in (tmp_path / "nope", tmp_path):
        with pytest.warns(UserWarning, match=r"latest: no 'latest' file, nothing loaded"):
            assert e.load_checkpoint(empty) == (None, None)
    assert e.global_steps == 0
    with pytest.raises(CheckpointError, match="nope: checkpoint directory not found"):
        e.load_checkpoint(tmp_path / "nope", tag="global_step1")
    with pytest.raises(CheckpointError, match="checkpoint tag 'global_step9' not found"):
        e.load_checkpoint(saved, tag="global_step9")


def test_corrupt_file_names_it(tmp_path, saved):
    import shutil

    d = tmp_path / "c"
    shutil.copytree(saved, d)
    f = d / "global_step1" / "model_states.pt"
    f.write_bytes(f.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError, match=r"model_states.pt: cannot read checkpoint file"):
        _engine().load_checkpoint(d)
    (d / "global_step1" / "rank_0_optim_states.pt").unlink()
    shutil.copy(saved / "global_step1" / "model_states.pt", f)
    with pytest.raises(CheckpointError, match=r"rank_0_optim_states.pt: checkpoint file not found"):
        _engine().load_checkpoint(d)
    (d / "global_step1" / "metadata.json").unlink()  # not taken for a DeepSpeed checkpoint
    with pytest.raises(CheckpointError, match=r"metadata.json: checkpoint metadata not found"):
        _engine().load_checkpoint(d)


def test_model_mismatch_names_first_tensor(saved):
    with pytest.raises(CheckpointError, match=r"tensor 'tok_emb.weight' has shape \[256, 32\] in "
                                              r"the checkpoint but \[256, 48\] in the model"):
        _engine(d_model=48).load_checkpoint(saved)


def test_overwriting_a_tag_and_bad_tag(tmp_path):
    e = _engine()
    _train(e)
    e.save_checkpoint(tmp_path, tag="t")
    _train(e)
    e.save_checkpoint(tmp_path, tag="t")
    assert (tmp_path / "latest").read_text() == "t"
    # no leftovers (zero_to_fp32.py is written beside the checkpoints on purpose)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "t", "zero_to_fp32.py"]
    f = _engine()
    f.load_checkpoint(tmp_path)
    assert f.global_steps == 2
    with pytest.raises(CheckpointError, match="not a plain directory name"):
        e.save_checkpoint(tmp_path, tag="../x")


def test_stage0_optimizer_state_into_zero_is_a_clear_error(saved):
    """Stage 0 keeps torch's per-parameter optimizer state, ZeRO 1-3 shards: only the weights
    carry over, and the error says how to take them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))
    e, *_ = dslaunch.initialize(model=model, config=dict(CFG, zero_optimization={"stage": 2}))
    with pytest.raises(CheckpointError, match=r"ZeRO stage 0, this job has 1 and stage 2; only ZeRO "
                                              r"stages 1-3 convert .*load_optimizer_states=False"):
        e.load_checkpoint(saved)
    path, _ = e.load_checkpoint(saved, load_optimizer_states=False)
    assert path.endswith("global_step1") and e.global_steps == 1


def test_publish_dir_replaces_a_tag_saved_again_and_leaves_nothing_aside(tmp_path):
    """The ZeRO and pipeline savers share it: the new tag replaces the old whole, no `.old` stays."""
    from dslaunch.engine.storage.files import publish_dir

    final, tmp = tmp_path / "global_step5", tmp_path / ".global_step5.tmp"
    final.mkdir()
    (final / "a.pt").write_text("old")
    tmp.mkdir()
    (tmp / "b.pt").write_text("new")
    publish_dir(str(tmp), str(final))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step5"]
    assert [p.name for p in final.iterdir()] == ["b.pt"] and (final / "b.pt").read_text() == "new"
