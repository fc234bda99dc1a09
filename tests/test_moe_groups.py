"""Expert-parallel groups (dslaunch.utils.groups, as deepspeed.utils.groups) and the MoE parameter
marking contract (dslaunch.moe.utils): DeepSpeed 0.19.8's rank layouts, names and semantics.
The layouts below are the examples of DeepSpeed's docstrings; the multi-rank groups themselves
are checked by tests/test_moe_layer.py's launch."""

from __future__ import annotations

import pytest
import torch

from dslaunch.engine.parallel import expert_groups
from dslaunch.engine.parallel.expert_groups import expert_rank_lists
from dslaunch.engine.parallel.moe import params as moe_params
from dslaunch.utils import groups


def test_e_plus_d_layout_of_deepspeeds_docstring():
    ep, edp = expert_rank_lists(16, 2)
    assert ep == [[i, i + 1] for i in range(0, 16, 2)]
    assert edp == [list(range(0, 16, 2)), list(range(1, 16, 2))]


def test_d_plus_e_and_pipeline_stages():
    ep, edp = expert_rank_lists(8, 2, data_before_expert=True)
    assert edp == [[0, 1, 2, 3], [4, 5, 6, 7]] and ep == [[0, 4], [1, 5], [2, 6], [3, 7]]
    ep, edp = expert_rank_lists(8, 2, pp=2)  # groups never cross a pipeline stage
    assert ep == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert edp == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_tensor_parallel_layouts():
    # E + M + D example of DeepSpeed's _get_expert_parallel_ranks docstring: world 16, tp 2, ep 4
    ep, edp = groups._get_expert_parallel_ranks(16, 2, 4)
    assert ep == [[0, 2, 4, 6], [8, 10, 12, 14], [1, 3, 5, 7], [9, 11, 13, 15]]
    assert edp[:4] == [[0, 8], [2, 10], [4, 12], [6, 14]] and edp[4] == [1, 9]
    ep, edp = expert_rank_lists(8, 2, mp=2, mp_mode="tp")  # tensor lanes first
    assert ep == [[0, 2], [4, 6], [1, 3], [5, 7]] and edp[0] == [0, 4, 1, 5]
    ep, _ = expert_rank_lists(8, 2, mp=2, mp_mode="sp")
    assert ep == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_groups_by_name_in_a_world_of_one(world_of_one):
    assert groups._get_max_expert_size() is None
    groups._create_expert_and_data_parallel(1)
    groups._create_expert_and_data_parallel(1)  # made once
    assert list(groups._get_expert_parallel_group_dict()) == ["ep_size_1"]
    assert groups._get_expert_parallel_world_size("ep_size_1") == 1
    assert groups._get_expert_data_parallel_world_size("ep_size_1") == 1
    assert groups._get_expert_parallel_rank("ep_size_1") == 0
    assert groups._get_expert_data_parallel_group_ranks("ep_size_1") == [0]
    assert groups._get_max_expert_size() == 1 and groups._get_max_expert_size_name() == "ep_size_1"
    with pytest.raises(AssertionError, match="ep_size_2"):
        groups._get_expert_parallel_group("ep_size_2")
    with pytest.raises(ValueError):
        groups._create_expert_and_data_parallel(2)  # 1 rank cannot hold 2 expert shards
    expert_groups.reset()


def _param(n, expert=None):
    p = torch.nn.Parameter(torch.zeros(n))
    if expert is not None:
        p.allreduce, p.group_name = False, expert
    return p


def test_split_params_into_moe_groups_as_deepspeed():
    dense, e2a, e2b, e4 = _param(3), _param(5, "ep_size_2"), _param(5, "ep_size_2"), _param(2, "ep_size_4")
    plain = _param(1)
    plain.allreduce = True  # marked but reduced normally: not an expert parameter
    assert moe_params.is_moe_param(e2a) and not moe_params.is_moe_param(dense)
    assert not moe_params.is_moe_param(plain)
    out = moe_params.split_params_into_different_moe_groups_for_optimizer(
        ({"name": "decay", "params": [dense, e2a, e4], "lr": 0.1},
         {"name": "nodecay", "params": [plain, e2b], "weight_decay": 0.0}), max_group_size=6)
    assert [g["name"] for g in out] == ["decay", "nodecay", "ep_size_2", "ep_size_4", "ep_size_2"]
    assert out[0]["params"] == [dense] and out[1]["params"] == [plain]
    assert out[2]["moe"] and out[2]["lr"] == 0.1 and out[2]["params"] == [e2a]
    assert out[3]["params"] == [e4] and out[4]["weight_decay"] == 0.0 and out[4]["params"] == [e2b]
    assert not moe_params.is_moe_param_group(out[0]) and moe_params.is_moe_param_group(out[2])
    # cut at max_group_size elements
    many = [_param(4, "ep_size_2") for _ in range(3)]
    out = moe_params.split_params_into_different_moe_groups_for_optimizer(
        {"name": "g", "params": many}, max_group_size=8)
    assert [len(g["params"]) for g in out] == [0, 2, 1]
    groups_ = moe_params.configure_moe_param_groups([dense, e2a])
    assert [g["name"] for g in groups_] == ["dense-params", "ep_size_2"]
