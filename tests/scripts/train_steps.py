"""The optimizer step the ZeRO rank scripts share: ``gas`` micro-steps of the example GPT's batches
through an engine."""

import torch


def micro_steps(engine, batches, step: int, gas: int, rank: int, world: int) -> torch.Tensor:
    """Run global step ``step`` (forward, backward and ``engine.step()`` per micro-step); this
    rank's loss averaged over the micro-steps, a 1-element tensor to all-reduce."""
    tot = torch.zeros(1)
    for m in range(gas):
        tok, tgt = batches.batch_at(step * gas + m, rank, world)
        loss = engine(tok, tgt)
        engine.backward(loss)
        engine.step()
        tot += loss.detach().float() / gas
    return tot
