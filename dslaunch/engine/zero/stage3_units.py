"""ZeRO stage 3's fetch units: which parameters are gathered together, and the bucket layout that
follows from that.

A fetch unit is the set of parameters a module owns directly (``recurse=False``): they are
gathered just before that module runs (forward or backward) and released after. Each unit becomes
one bucket per optimizer param group (more if it holds more than the bucket cap), so gathering a
unit is one ``all_gather_into_tensor`` per bucket and its gradients one ``reduce_scatter_tensor``.
A parameter registered under two modules (tied weights) belongs to the first one in
``named_modules()`` order, but both modules fetch its bucket. A module that uses another module's
parameter in its forward names it with ``dslaunch.zero.register_external_parameter(module, p)``
(DeepSpeed's call): it is then fetched with that module too; a module whose forward reads it
without saying so gets it added to its unit at that first read (``stage3_access.py``). A module marked a ZeRO-3 leaf
(``leaf_modules.py``, ``dslaunch.utils.set_z3_leaf_modules``) is one unit with every parameter of
its subtree, and the modules inside it get none of their own.

Parameters smaller than ``stage3_param_persistence_threshold`` elements are *persistent*: packed
into buckets of their own that stay gathered on every rank (they are still partitioned for the
optimizer, and re-gathered after each step).

The result is an ordinary ``partition.Layout`` per group (the checkpoint format of stages 1-2:
``checkpoint/consolidate.py``, ``reshape.py`` and ``zero_shards.py`` read it unchanged); only
the choice of which parameters share a bucket differs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from dslaunch.engine.base import partition as P
from dslaunch.engine.base.autocast import comm_dtype
from dslaunch.engine.zero.leaf_modules import z3_leaf_module


@dataclass
class UnitPlan:
    layouts: list  # one partition.Layout per optimizer group
    persistent: set  # {(group, bucket)} that stay gathered
    fetch: dict  # module -> sorted [(group, bucket)] its forward needs (non-persistent)
    key_of: dict  # parameter name -> (group, bucket)
    # the modules the strategy hooks: every module but those inside a leaf (a module with no unit
    # of its own is hooked too, so that a parameter its forward reads can join it:
    # ``stage3_access.py``)
    modules: list

    def add_to_unit(self, module, key) -> bool:
        """``module``'s forward reads the parameters of bucket ``key`` (outside their own
        module): fetch it with ``module`` from now on. False if it already was."""
        keys = self.fetch.setdefault(module, [])
        if key in keys:
            return False
        keys.append(key)
        keys.sort()
        return True

    def numel(self, key) -> int:
        gi, bi = key
        return self.layouts[gi].buckets[bi].numel


def _pack(named, cap):
    """Split [(name, param)] into runs of at most ``cap`` elements (a bigger one goes alone);
    parameters with different autocast communication dtypes never share a run."""
    runs, cur, used = [], [], 0
    for name, p in named:
        n = p.numel()
        if cur and (used + n > cap or comm_dtype(p) != comm_dtype(cur[-1][1])):
            runs.append(cur)
            cur, used = [], 0
        cur.append((name, p))
        used += n
    if cur:
        runs.append(cur)
    return runs


def _layout(runs, world) -> P.Layout:
    buckets, offset = [], 0
    for run in runs:
        slots, used = [], 0
        for name, p in run:
            slots.append(P.Slot(name, tuple(p.shape), used, p.numel()))
            used += p.numel()
        numel = -(-used // world) * world
        buckets.append(P.Bucket(offset, numel, slots))
        offset += numel
    return P.Layout(world, buckets)


def plan_units(model, named_groups, world: int, cap: int, persistence_threshold: int) -> UnitPlan:
    """``named_groups``: [[(name, param)] per optimizer group] (``common.named_groups``)."""
    where = {id(p): (gi, n) for gi, g in enumerate(named_groups) for n, p in g}
    taken = set()
    direct = {}  # module -> the trainable parameters of its unit (tied ones included)
    owned = []  # (module, [[(name, p)] per group]) for the parameters it owns first
    persist = [[] for _ in named_groups]
    inside_leaf = set()  # modules under a leaf: gathered with it, no unit of their own
    hooked = []
    for _, m in model.named_modules():
        if m in inside_leaf:
            continue
        hooked.append(m)
        members = [m]
        if z3_leaf_module(m):
            members = list(m.modules())
            inside_leaf.update(members[1:])
        extra = [p for sub in members for p in getattr(sub, "_dsl_external_params", ())
                 if p is not None]
        params = [p for sub in members for p in sub.parameters(recurse=False)]
        ps = [p for p in params + extra if id(p) in where]
        ps = list({id(p): p for p in ps}.values())
        if not ps:
            continue
        direct[m] = ps
        own = [[] for _ in named_groups]
        for p in ps:
            if id(p) in taken:
                continue
            taken.add(id(p))
            gi, name = where[id(p)]
            (persist[gi] if p.numel() < persistence_threshold else own[gi]).append((name, p))
        owned.append(own)
    runs = [[] for _ in named_groups]
    # reverse module order: roughly the order backward finishes the units
    for own in reversed(owned):
        for gi, named in enumerate(own):
            runs[gi].extend(_pack(named, cap))
    first_persistent = [len(r) for r in runs]
    for gi, named in enumerate(persist):
        runs[gi].extend(_pack(named, cap))
    layouts = [_layout(r, world) for r in runs]
    persistent = {(gi, bi) for gi, r in enumerate(runs)
                  for bi in range(first_persistent[gi], len(r))}
    key_of = {s.name: (gi, bi) for gi, lay in enumerate(layouts)
              for bi, b in enumerate(lay.buckets) for s in b.slots}
    fetch = defaultdict(list)
    for m, ps in direct.items():
        keys = {key_of[where[id(p)][1]] for p in ps} - persistent
        if keys:
            fetch[m] = sorted(keys)
    return UnitPlan(layouts, persistent, dict(fetch), key_of, hooked)
