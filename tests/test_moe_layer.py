"""Expert parallelism across ranks: one ``dslaunch run --as-deepspeed`` of 4 ranks (gloo) builds
the same pyramid MoE model (4- then 8-expert layers; top-1 with token dropping and random
token selection, top-2 dropless with a residual MLP) at ep sizes (1, 1), (2, 2), (4, 4) and
(2, 4) and checks against (1, 1): outputs, l_aux and gradients (expert gradients summed over the
expert-data-parallel group, dense over the world) to 1e-5 relative; the groups' ranks; and that
``deepspeed.moe`` under the alias is dslaunch's (tests/scripts/moe_ep_ranks.py)."""

from __future__ import annotations

import subprocess

from helpers import DSLAUNCH, ROOT, SCRIPTS, rank_env, results


def test_same_outputs_and_gradients_at_every_ep_size(tmp_path):
    cmd = [*DSLAUNCH, "run", "--nproc-per-node", "4", "--omp-threads", "1", "--as-deepspeed",
           str(SCRIPTS / "moe_ep_ranks.py"), "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = results(tmp_path / "o", 4)
    for r, res in enumerate(ranks):
        for ep in ("ep2_2", "ep4_4", "ep2_4"):
            for what in ("out", "aux", "dense_grad", "expert_grad"):
                assert res[f"{ep}_{what}"] <= 1e-5, (r, ep, what, res[f"{ep}_{what}"])
        assert res["dropped_1_1"] > 0 and res["dropped_1_1"] == res["dropped_4_4"]  # drops
        assert res["grad_nonzero"] and res["as_deepspeed"] is True
        assert res["max_expert_size"] == 4
        # rank r holds experts r*E/ep ... of each layer
        assert res["ep4_4_experts_here"] == sorted([f"moe_a:{r}", f"moe_b:{2 * r}",
                                                    f"moe_b:{2 * r + 1}"])
        pair = r // 2 * 2
        g = res["groups"]
        assert g["ep_size_1"][:2] == [[r], [0, 1, 2, 3]]
        assert g["ep_size_2"] == [[pair, pair + 1], [r % 2, r % 2 + 2], 2, r % 2, r // 2]
        assert g["ep_size_4"] == [[0, 1, 2, 3], [r], 4, r, 0]
