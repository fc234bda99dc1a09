"""Mixture of experts: DeepSpeed-MoE's layer, gates, experts and parameter groups (public as
``dslaunch.moe``). ``params`` is the marking contract the engine reads (expert parameters have
``allreduce = False`` and ``group_name = "ep_size_{N}"``); ``gating`` routes tokens; ``dispatch``
moves them to their experts' ranks and back in capacity-sized buffers, ``ragged`` (dropless)
exactly the routed ones; ``layer`` puts them together."""
