"""ZeRO stage 3: a parameter read by a forward other than its own module's.

Stage 3 gathers a module's own parameters around its forward (``stage3_units.py``). Real models
also read parameters elsewhere: ``nn.MultiheadAttention`` passes ``self.out_proj.weight`` to
``F.linear`` without calling ``out_proj``; a language model head reads the embedding's weight; a
parent's forward reads a child's. Such a read would find an empty (released) tensor.

So every module holding partitioned parameters gets a ``_parameters`` dict that notices a read
(``module.weight`` is ``module._parameters["weight"]``): a read of a released parameter while a
hooked forward runs gathers its bucket at once and adds it to the unit of the innermost module
running (``FetchCoordinator.read_outside``), so from then on that module gathers it before its
forward and its backward like its own, and releases it after. This is DeepSpeed's behaviour (its
``ZeROOrderedDict`` registers such a parameter as external to the running module); declaring it
beforehand with ``zero.register_external_parameter`` still works and saves the first, unplanned
gather. Outside any forward a read gathers nothing (use ``zero.GatheredParameters``).

The read is collective (an all-gather): every rank runs the same forward, so every rank reads
the same parameters in the same order.
"""

from __future__ import annotations

from dslaunch.engine.zero.stage3_fetch import GATHERED


class _ReadWatched(dict):
    """A module's ``_parameters`` that reports each read of a parameter to ``on_read``."""

    __slots__ = ("on_read",)

    def __getitem__(self, name):
        p = dict.__getitem__(self, name)
        if p is not None:
            self.on_read(p)
        return p

    def __reduce_ex__(self, protocol):  # a copy (deepcopy, pickle) is a plain dict
        return dict, (list(dict.items(self)),)


class _Watch:
    """The handle ``gather_on_read`` returns: ``remove()`` gives the modules plain dicts back
    (kept with the strategy's module hooks, which frameworks remove and re-install together)."""

    def __init__(self, modules):
        self.modules = modules

    def remove(self) -> None:
        for m in self.modules:
            if isinstance(m.__dict__.get("_parameters"), _ReadWatched):
                m.__dict__["_parameters"] = dict(m.__dict__["_parameters"])
        self.modules = []


def gather_on_read(strategy, model) -> _Watch:
    """Watch every module of ``model`` that owns parameters in a non-persistent bucket of the
    stage-3 ``strategy``."""
    plan = strategy.plan
    key_by_param = {id(p): plan.key_of[name] for g in strategy.groups
                    for name, p in g.params.items()
                    if plan.key_of[name] not in plan.persistent}

    def on_read(p):
        key = key_by_param.get(id(p))
        if key is not None and strategy.store.state[key] != GATHERED:
            strategy.fetcher.read_outside(key)

    watched = []
    for m in model.modules():
        params = m.__dict__.get("_parameters")
        if not isinstance(params, dict) or isinstance(params, _ReadWatched) or \
                not any(id(p) in key_by_param for p in params.values()):
            continue
        wrapped = _ReadWatched(params)
        wrapped.on_read = on_read
        m.__dict__["_parameters"] = wrapped
        watched.append(m)
    return _Watch(watched)
