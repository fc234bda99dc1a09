"""The ragged dropless dispatch (dslaunch/engine/parallel/moe/ragged.py) on 2 real gloo ranks
(tests/scripts/moe_ragged_ranks.py, in the one ``dslaunch run`` of tests/moe_jobs.py): at EP 2
with 4 experts, top-1, top-2, top-1 with an expert no token picks and top-1 with unused tokens
(``used_token``), it gives the padded dispatch's outputs, l_aux and gradients (input and every
parameter) to 1e-6 relative, routes every used token's choices, and its all-to-alls carry
exactly the routed tokens: per forward + backward a rank sends its routed choices and the
gradients of its experts' outputs (2 x routed x hidden x 4 bytes, fp32) and its experts' outputs
and its choices' input gradients (2 x received x hidden x 4), plus one exchange of the E per-
expert counts (over both ranks: 4 x all routed choices x hidden x 4, no padding); the padded
path sends 4 x E x the busiest expert's count x hidden x 4."""

from __future__ import annotations

import pytest
from moe_jobs import two_rank_job

CASES = ("top1", "top2", "top1_idle_expert", "top1_used_token")


def test_ragged_matches_padded_and_sends_no_padding(job_cache):
    # one launch with the other MoE test files' 2-rank jobs (tests/moe_jobs.py)
    ranks = two_rank_job(job_cache, "moe_ragged").results(sub="o")
    for r, res in enumerate(ranks):
        for name in CASES:
            c = res[name]
            for what in ("out", "aux", "x_grad", "param_grad"):
                assert c[what] <= 1e-6, (r, name, what, c[what])
            # every used token routed (an unused one goes nowhere, in both paths)
            assert c["routed"] == c["k"] * c["used"], (r, name, c)
            assert c["dropped"] == pytest.approx(1 - c["used"] / c["tokens"]), (r, name, c)
            # forward: its routed choices out, its experts' outputs back; backward the reverse
            rows = 2 * (c["routed"] + c["received"])
            counts = c["experts"] * c["count_dtype_bytes"]
            assert c["ragged_bytes"] == rows * c["hidden"] * c["dtype_bytes"] + counts, (r, name, c)
            assert c["padded_bytes"] == (4 * c["experts"] * c["padded_capacity"] * c["hidden"]
                                         * c["dtype_bytes"]), (r, name, c)
            assert c["ragged_bytes"] < c["padded_bytes"], (r, name, c)
        assert res["top1_idle_expert"]["expert_3_tokens"] == 0
    assert res["top1_used_token"]["used"] < res["top1_used_token"]["tokens"]
    for name in CASES:
        both = [res[name] for res in ranks]
        assert sum(c["received"] for c in both) == sum(c["routed"] for c in both)
