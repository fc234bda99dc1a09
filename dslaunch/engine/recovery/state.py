"""The state in-process recovery moves: what the first survivor sends a replacement (what a
checkpoint would hold), and at ZeRO 1-3 the shards rebuilt from the copies every rank keeps of a
neighbour's (``shard_copies.py``)."""

from __future__ import annotations

from dslaunch.engine.recovery.refusals import sharded
from dslaunch.engine.recovery.shard_copies import consistent
from dslaunch.engine.storage.zero_shards import HeldShards, load_resharded_from


def module_state(engine) -> dict:
    """The module's state for a newcomer: all of it, or with shard copies what the optimizer
    does not train (buffers, frozen parameters): the trained parameters come from the shards
    (at ZeRO 3 no rank holds them whole)."""
    sd = engine.module.state_dict(keep_vars=True)
    if sharded(engine):
        trained = {id(p) for g in engine.strategy.groups for p in g.params.values()}
        sd = {k: v for k, v in sd.items() if id(v) not in trained}
    return {k: v.detach() for k, v in sd.items()}


def engine_state(engine) -> dict:
    sched = engine.lr_scheduler
    # a ZeRO 1-3 shard is the sender's own: each rank's comes from the shards (recover_shards)
    strategy = None if sharded(engine) else engine.strategy.state_dict()
    return {"module": module_state(engine), "strategy": strategy,
            # every TP rank's rows (AutoTP): a replacement built alone could not gather them
            "autotp_layout": getattr(engine.module, "ds_autotp_layout", None),
            "lr_scheduler": sched.state_dict() if sched is not None else None,
            "loss_scaler": engine.precision.scaler.state_dict(),
            "counters": {k: getattr(engine, k) for k in ("global_steps", "global_samples",
                                                         "micro_steps", "skipped_steps")}}


def load_engine_state(engine, state: dict) -> None:
    engine.module.load_state_dict(state["module"], strict=not sharded(engine))
    if state["strategy"] is not None:
        engine.strategy.load_state_dict(state["strategy"])
    if state["lr_scheduler"] is not None and engine.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    engine.precision.scaler.load_state_dict(state["loss_scaler"])
    if state.get("autotp_layout") is not None:
        engine.module.ds_autotp_layout = state["autotp_layout"]
    for key, value in state["counters"].items():
        setattr(engine, key, value)


def relayout(strategy, joining: bool) -> bool:
    """Whether a member lays its parameters out again: a replacement, every member when the world
    shrank, and at ZeRO 3 every member (its store's gathered units and gathers in flight belong to
    the old group, and the layout looks the hosts up again: a collective)."""
    comm = strategy.comm
    return joining or strategy.stage == 3 or (strategy.world, strategy.rank) != \
        (comm.world_size, comm.rank)


def recover_shards(engine, joining: bool) -> str | None:
    """ZeRO 1-3: every member hands in the shards it holds (its own and its copy of its ward's,
    zero/shard_copies.py); a member whose layout changed (``_relayout``) lays its parameters out
    again and takes its new shard from them; then the
    updated chunks are all-gathered and the copies exchanged in the new world. Returns why the
    shards cannot rebuild the state (None: done). Each member decides from the same gathered
    shards, so all refuse or none."""
    import torch.distributed as dist

    strategy = engine.strategy
    held = {} if joining else strategy.copies.held(strategy)
    # the optimizer's hyperparameters as they are now: a copy's were taken inside the step,
    # before the LR scheduler stepped
    hyper = None if joining else [{k: v for k, v in pg.items() if k != "params"}
                                  for pg in strategy.optimizer.param_groups]
    # over the strategy's group: under AutoTP each TP rank's data group holds shards of its own
    # slices, under the same names as the other TP ranks'
    offers = [None] * strategy.comm.world_size
    dist.all_gather_object(offers, (held, hyper), group=strategy.comm.group)
    shards = {rank: sd for offer, _ in offers for rank, sd in offer.items()}
    live = next(h for _, h in offers if h is not None)
    for sd in shards.values():
        sd["param_groups"] = live
    old_world = max((sd["zero"]["world_size"] for sd in shards.values()), default=0)
    why = consistent(shards, old_world)
    if why:
        return why
    if relayout(strategy, joining):
        strategy.repartition()
        load_resharded_from(strategy, HeldShards(shards), old_world, gather=False)
        strategy.version = next(iter(shards.values()))["version"]
    strategy._all_gather_params()
    strategy.copies.exchange(strategy)
    return None
