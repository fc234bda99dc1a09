"""The expert-parallel and expert-data-parallel process groups of mixture-of-experts layers, under
the names of DeepSpeed 0.19.8's private ``deepspeed.utils.groups`` accessors (public as
``dslaunch.utils.groups``).

An MoE layer with ``ep_size = N`` spreads its experts over N ranks (its expert-parallel group:
tokens travel there by all-to-all) and each expert is replicated on the other ranks holding the
same slice of experts (its expert-data-parallel group: the expert's gradients are reduced
there). Groups are keyed by name, ``ep_size_{N}``, so one model may mix several ep sizes (a
pyramid); each set is made once, by every rank, in the same order (``dist.new_group``).

The rank layout is DeepSpeed's, so a script that reads the groups' ranks sees the same ones:
within each pipeline stage of ``world / pp`` consecutive ranks, expert-parallel groups are runs of
N consecutive ranks and expert-data-parallel groups take every N-th rank (E + D);
``use_data_before_expert_parallel_`` swaps the two (D + E). With tensor parallelism
(``mp_size`` > 1) the ranks of a stage are first ordered tensor-lane-major ("tp") or kept
("sp"), then cut the same way.
"""

from __future__ import annotations

import torch.distributed as dist

from dslaunch.engine.parallel import groups as parallel_groups

# group name -> this rank's group / the ranks of that group
_EXPERT_PARALLEL_GROUP: dict = {}
_EXPERT_PARALLEL_GROUP_RANKS: dict = {}
_EXPERT_DATA_PARALLEL_GROUP: dict = {}
_EXPERT_DATA_PARALLEL_GROUP_RANKS: dict = {}
# the tensor-parallel size of the experts (DeepSpeed's expert_tensor_parallel_world_size):
# set when groups are made with the mpu's tensor parallelism (expert tensor parallelism)
expert_tensor_parallel_world_size = 1
_WORLD = [None]  # the world group the tables were made in: a new world starts them over


def _same_world() -> None:
    if _WORLD[0] is not dist.group.WORLD:
        reset()
        _WORLD[0] = dist.group.WORLD


def group_name(ep_size: int) -> str:
    return f"ep_size_{ep_size}"


def _ensure_divisibility(numerator: int, denominator: int) -> None:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")


def _pipe_size() -> int:
    return parallel_groups._get_pipe_parallel_world_size()


def _new_groups(name: str, ep_groups: list, edp_groups: list) -> None:
    """Make every group of both lists (all ranks call this alike) and keep this rank's."""
    rank = dist.get_rank()
    for table, ranks_table, lists in ((_EXPERT_PARALLEL_GROUP, _EXPERT_PARALLEL_GROUP_RANKS, ep_groups),
                                      (_EXPERT_DATA_PARALLEL_GROUP, _EXPERT_DATA_PARALLEL_GROUP_RANKS,
                                       edp_groups)):
        for ranks in lists:
            ranks = list(ranks)
            group = dist.new_group(ranks)
            if rank in ranks:
                table[name] = group
                ranks_table[name] = ranks


def expert_rank_lists(world: int, ep: int, pp: int = 1, mp: int = 1, mp_mode: str = "tp",
                      data_before_expert: bool = False) -> tuple[list, list]:
    """The ranks of every expert-parallel and every expert-data-parallel group (two lists of
    lists) of a world of ``world`` ranks: ``_create_expert_and_data_parallel``'s layout."""
    stride = world // pp  # ranks per pipeline stage
    _ensure_divisibility(stride, ep)
    ep_groups, edp_groups = [], []
    for start in range(0, world, stride):
        stage = list(range(start, start + stride))
        if mp > 1:
            if data_before_expert:
                raise NotImplementedError("use_data_before_expert_parallel_ with mp_size > 1")
            if mp_mode == "tp":  # tensor lanes first: a lane's ranks share no tensor group
                stage = [stage[g * mp + lane] for lane in range(mp) for g in range(stride // mp)]
            runs = [stage[g * ep:(g + 1) * ep] for g in range(stride // ep)]
            ep_groups += runs
            edp_groups += [[run[pos] for run in runs] for pos in range(ep)]
        elif data_before_expert:  # D + E: replicas are neighbours
            per = stride // ep
            edp_groups += [stage[i * per:(i + 1) * per] for i in range(ep)]
            ep_groups += [stage[i::per] for i in range(per)]
        else:  # E + D
            ep_groups += [stage[i * ep:(i + 1) * ep] for i in range(stride // ep)]
            edp_groups += [stage[i::ep] for i in range(ep)]
    return ep_groups, edp_groups


def _create_expert_and_data_parallel(expert_parallel_size_, mp_size=None, pp_size=None,
                                     mp_mode="tp", use_data_before_expert_parallel_=False,
                                     folding_spec=None):
    """Make the ``ep_size_{expert_parallel_size_}`` groups if they are not made yet (DeepSpeed's
    signature; ``folding_spec``, AutoEP + AutoTP folding, is not supported)."""
    if folding_spec is not None:
        raise NotImplementedError("dslaunch has no AutoTP, so no AutoEP + AutoTP folding_spec")
    if not dist.is_initialized():
        raise RuntimeError("expert groups need torch.distributed initialised")
    _same_world()
    ep = int(expert_parallel_size_)
    name = group_name(ep)
    if name in _EXPERT_PARALLEL_GROUP and name in _EXPERT_DATA_PARALLEL_GROUP:
        return
    pp = _pipe_size() if pp_size is None else int(pp_size)
    mp = 1 if mp_size is None else int(mp_size)
    ep_groups, edp_groups = expert_rank_lists(dist.get_world_size(), ep, pp, mp, mp_mode,
                                              use_data_before_expert_parallel_)
    _new_groups(name, ep_groups, edp_groups)


def _get_expert_parallel_ranks(world_size, tensor_parallel_size_, expert_parallel_size_,
                               pipeline_parallel_size_=1, use_data_before_expert_parallel_=False):
    """The rank lists (expert parallel, expert data parallel) of E + M + D parallelism: the
    expert groups are cut from each data-parallel group (ranks strided by the tensor size)."""
    tp, ep, pp = tensor_parallel_size_, expert_parallel_size_, pipeline_parallel_size_
    _ensure_divisibility(world_size, tp * pp)
    dp = world_size // (tp * pp)
    _ensure_divisibility(dp, ep)
    stride = world_size // pp
    dp_groups = []
    for start in range(0, world_size, stride):
        for lane in range(tp):
            if use_data_before_expert_parallel_:
                dstride = dp // ep
                ranks = []
                for d in range(dstride):
                    ranks += list(range(start + lane + d * tp, start + stride, dstride * tp))
                dp_groups.append(ranks)
            else:
                dp_groups.append(list(range(start + lane, start + stride, tp)))
    ep_groups, edp_groups = [], []
    for ranks in dp_groups:
        runs = [ranks[i:i + ep] for i in range(0, dp, ep)]
        ep_groups += runs
        edp_groups += [list(r) for r in zip(*runs)]
    return ep_groups, edp_groups


def _create_expert_data_and_model_parallel(expert_parallel_size_, mpu,
                                           use_data_before_expert_parallel_=False):
    """Expert groups inside the mpu's data-parallel groups, experts tensor-parallel like the
    rest of the model (DeepSpeed's ``enable_expert_tensor_parallelism``)."""
    global expert_tensor_parallel_world_size
    if not dist.is_initialized():
        raise RuntimeError("expert groups need torch.distributed initialised")
    _same_world()
    tp = _mpu_size(mpu, "get_tensor_model_parallel_world_size", "get_model_parallel_world_size")
    pp = _mpu_size(mpu, "get_pipe_parallel_world_size", "get_pipeline_model_parallel_world_size")
    expert_tensor_parallel_world_size = tp
    world = dist.get_world_size()
    _ensure_divisibility(world, tp)
    name = group_name(int(expert_parallel_size_))
    if name in _EXPERT_PARALLEL_GROUP or name in _EXPERT_DATA_PARALLEL_GROUP:
        return
    ep_groups, edp_groups = _get_expert_parallel_ranks(world, tp, int(expert_parallel_size_), pp,
                                                       use_data_before_expert_parallel_)
    _new_groups(name, ep_groups, edp_groups)


def _mpu_size(mpu, *names) -> int:
    for n in names:
        fn = getattr(mpu, n, None)
        if fn is not None:
            return int(fn())
    return 1


# -- accessors (DeepSpeed's names) ----------------------------------------------------------------

def _get_max_expert_size():
    """The largest ep size of the groups made so far (None before any)."""
    sizes = [int(key.split("_")[2]) for key in _EXPERT_PARALLEL_GROUP]
    return max(sizes) if sizes else None


def _get_max_expert_size_name():
    return group_name(_get_max_expert_size())


def _get_max_expert_parallel_group():
    return _get_expert_parallel_group(_get_max_expert_size_name())


def _lookup(table: dict, name: str, what: str):
    if name not in table:
        raise AssertionError(f"{what} group {name!r} is not initialized (an MoE layer with that "
                             f"ep_size makes it when dslaunch.initialize sees the model)")
    return table[name]


def _get_expert_parallel_group(group_name):
    return _lookup(_EXPERT_PARALLEL_GROUP, group_name, "expert parallel")


def _get_expert_parallel_group_ranks(group_name):
    return _lookup(_EXPERT_PARALLEL_GROUP_RANKS, group_name, "expert parallel")


def _get_expert_parallel_group_dict():
    return _EXPERT_PARALLEL_GROUP


def _get_expert_data_parallel_group(group_name):
    return _lookup(_EXPERT_DATA_PARALLEL_GROUP, group_name, "expert data parallel")


def _get_expert_data_parallel_group_ranks(group_name):
    return _lookup(_EXPERT_DATA_PARALLEL_GROUP_RANKS, group_name, "expert data parallel")


def _get_expert_data_parallel_group_dict():
    return _EXPERT_DATA_PARALLEL_GROUP


def _get_expert_parallel_world_size(group_name):
    return dist.get_world_size(group=_get_expert_parallel_group(group_name))


def _get_expert_parallel_rank(group_name):
    return dist.get_rank(group=_get_expert_parallel_group(group_name))


def _get_expert_parallel_src_rank(group_name):
    """The global rank of this rank's expert-parallel group's first rank (DeepSpeed's formula,
    right for the E + D layout)."""
    size = _get_expert_parallel_world_size(group_name)
    return (dist.get_rank() // size) * size


def _get_expert_data_parallel_world_size(group_name):
    return dist.get_world_size(group=_get_expert_data_parallel_group(group_name))


def _get_expert_data_parallel_rank(group_name):
    return dist.get_rank(group=_get_expert_data_parallel_group(group_name))


def _get_expert_broadcast_src_rank(group_name):
    return _get_expert_data_parallel_group_ranks(group_name)[0]


def _get_expert_model_parallel_world_size():
    return expert_tensor_parallel_world_size


def reset() -> None:
    """Forget every expert group (a new world: tests, a re-initialised process group)."""
    global expert_tensor_parallel_world_size
    for table in (_EXPERT_PARALLEL_GROUP, _EXPERT_PARALLEL_GROUP_RANKS,
                  _EXPERT_DATA_PARALLEL_GROUP, _EXPERT_DATA_PARALLEL_GROUP_RANKS):
        table.clear()
    expert_tensor_parallel_world_size = 1
