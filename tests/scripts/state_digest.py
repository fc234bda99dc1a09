"""A rank's training state as one short hash, for the in-process recovery scripts
(recover_train.py, inprocess_autotp_train.py): a replaced rank must end with its fault-free twin's."""

import hashlib

import torch


def state_digest(engine) -> str:
    h = hashlib.sha1()
    # the model's parameters where this rank holds them (ZeRO 3 frees those not gathered), then
    # what the optimizer steps (ZeRO 1-3: this rank's shard of the weights or fp32 masters) and
    # its state
    tensors = [p.detach() for p in engine.module.parameters() if p.untyped_storage().nbytes()]
    tensors += [p.detach() for g in engine.optimizer.param_groups for p in g["params"]]
    for state in engine.optimizer.state.values():
        tensors += [v for _, v in sorted(state.items()) if torch.is_tensor(v)]
    for t in tensors:
        h.update(t.contiguous().float().numpy().tobytes())
    return h.hexdigest()[:16]
