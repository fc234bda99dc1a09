"""Random layer-wise token dropping (random-LTD, DeepSpeed's ``data_efficiency.data_routing``):
each converted layer sees, during training, a random subset of the sequence's tokens whose size
the schedule grows step by step; the other tokens skip the layer unchanged.

- ``scheduler.py``: the kept-length schedule (``RandomLTDScheduler``) and its checkpoint state;
- ``tokens.py``: sampling the kept tokens, gathering them and scattering the layer's output back,
  in plain torch (DeepSpeed's need a CUDA op);
- ``layer.py``: the layer wrapper (``RandomLayerTokenDrop``);
- ``convert.py``: wrapping a model's layers, binding them to the engine, state-dict names;
- ``lr_schedule.py``: the learning rate over consumed layer tokens (``layer_token_lr_schedule``).

Public names at DeepSpeed's paths: ``dslaunch/runtime/data_pipeline/data_routing/`` and
``dslaunch/ops/random_ltd/``; the config keys: ``dslaunch/config/random_ltd.py``.
"""
