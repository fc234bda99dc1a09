"""Ulysses DistributedAttention (dslaunch.sequence.layer) against full attention, fp64, on 4
real ranks (gloo): sequence groups of 2 and 4, [b, s, h, d] and [s, b, h, d], MHA and grouped
key/value heads; output and q/k/v gradients. One launch (tests/scripts/ulysses_checks.py)."""

import inspect

from dslaunch.sequence.layer import DistributedAttention
from helpers import launch, results


def test_matches_full_attention_fp64(tmp_path):
    launch(tmp_path, None, "ulysses_checks.py", ["--out", tmp_path / "o"], nproc=4)
    for r in results(tmp_path / "o", 4):
        cases = {k: v for k, v in r.items() if k.startswith("sp")}
        assert len(cases) == 10  # sp 2 and 4 x both layouts x head layouts
        for case, err in cases.items():
            assert err <= 1e-12, (case, err)
        assert "query has 6 heads" in r["error_h6_kv6"]
        assert "key has 2 heads" in r["error_h8_kv2"]


def test_signature_is_deepspeeds():
    init = inspect.signature(DistributedAttention.__init__)
    assert list(init.parameters)[1:] == ["local_attention", "sequence_process_group",
                                         "scatter_idx", "gather_idx", "sp_stream",
                                         "num_kv_heads"]
    assert init.parameters["scatter_idx"].default == 2
    assert init.parameters["gather_idx"].default == 0
    fwd = list(inspect.signature(DistributedAttention.forward).parameters)
    assert fwd[:6] == ["self", "query", "key", "value", "batch_dim_idx", "rotary_pos_emb"]
