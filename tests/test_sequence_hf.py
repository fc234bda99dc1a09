"""The Hugging Face path of Ulysses under `dslaunch run --as-deepspeed`: a tiny Llama built from
a transformers config, registered with ``UlyssesSPAttentionHF.register_with_transformers`` and fed
by ``UlyssesSPDataLoaderAdapter`` (tests/scripts/hf_ulysses.py), trains to the same losses at
SP 2 (2 ranks) as at SP 1 (one rank), fp32, within 1e-5 relative; ignored tokens fall unevenly
on the shards. Two launches."""

import pytest

from dslaunch.runtime.sequence_parallel import ulysses_sp

pytest.importorskip("transformers")


def _losses(job_cache, sp):
    job = job_cache.run(f"hf_ulysses_sp{sp}", "hf_ulysses.py", "--sp", sp, "--out",
                        "{dir}/out.json", nproc=sp, flags=("--as-deepspeed",))
    assert job.ok, job.log[-3000:]
    out = job.json()
    assert out["sp"] == sp
    return out["losses"]


def test_llama_losses_equal_at_sp1_and_sp2(job_cache):
    one, two = _losses(job_cache, 1), _losses(job_cache, 2)
    assert len(one) == len(two) == 4
    assert max(abs(a - b) / abs(a) for a, b in zip(one, two)) <= 1e-5


def test_names_and_signatures_are_deepspeeds():
    import inspect

    reg = inspect.signature(ulysses_sp.UlyssesSPAttentionHF.register_with_transformers)
    assert list(reg.parameters) == ["model_name_or_path", "core_attn_implementation",
                                    "sequence_parallel_size", "micro_batch_size", "seq_length",
                                    "seq_length_is_variable", "disable_in_eval", "max_length"]
    adapter = inspect.signature(ulysses_sp.UlyssesSPDataLoaderAdapter)
    assert list(adapter.parameters) == ["dl", "sp_rank", "sp_group", "sp_world_size", "device"]
    assert ulysses_sp.UlyssesSPAttentionHF.register_with_transformers(
        "unused", "sdpa", sequence_parallel_size=1, micro_batch_size=1) is None
    from dslaunch.sequence import tiled

    assert ulysses_sp.TiledMLP is tiled.TiledMLP
    assert ulysses_sp.TiledFusedLogitsLoss is tiled.TiledFusedLogitsLoss
