"""End a rank started by torchrun without gloo's teardown race.

gloo's threads outliving the Python objects they serve made a rank abort at interpreter exit now
and then ("terminate called without an active exception": SIGABRT), failing a run whose work was
done. dslaunch's bootstrap avoids it for its own ranks; reference runs under torchrun call this
last.
"""

import os
import sys

import torch.distributed as dist


def exit_cleanly() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
