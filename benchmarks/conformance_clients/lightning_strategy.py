"""Lightning's DeepSpeed strategy as its docs show it:
``Trainer(accelerator=..., devices=2, strategy=DeepSpeedStrategy(stage=2))`` and ``fit``. The
accelerator is the CPU here; Lightning's own check refuses the strategy without CUDA GPUs under
either engine, so this row records that both stop at the same place."""

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 4))

    def training_step(self, batch, i):
        loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
        if self.global_rank == 0:
            print(f"step {self.global_step} loss {loss.item():.6f}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g),
                                      torch.randint(0, 4, (64,), generator=g))
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DeepSpeedStrategy(stage=2),
                     max_steps=4, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False)
trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=8))
