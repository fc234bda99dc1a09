"""Mixture of experts: DeepSpeed-MoE's layer, gates, experts and parameter groups (public as
``dslaunch.moe``). ``params`` is the marking contract the engine reads (expert parameters have
``allreduce = False`` and ``group_name = "ep_size_{N}"``); ``gating`` routes tokens; ``dispatch``
moves them to their experts' ranks and back; ``layer`` puts them together."""
