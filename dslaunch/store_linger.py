"""Rank 0 stays until every rank is done with the job's store.

Under ``dslaunch run`` the ranks meet through ``env://``: rank 0's process hosts the TCP store
(torchrun's agent hosts it; ours starts no torch). If rank 0 ended first, the store would go with
it, and a rank still using it (a key, a late ``new_group`` whose gloo rendezvous goes through the
store) would fail with "Broken pipe" where under torchrun it works. So at a rank's end the
bootstrap calls ``leave``: every rank counts itself out on the default group's store, and rank 0,
ending well, waits until all have, or ``DSLAUNCH_STORE_LINGER_S`` seconds (30) have passed (a rank
that ends with ``os._exit`` never counts itself out). Nothing happens unless the script itself
imported and initialised ``torch.distributed`` and its group is still up: this module imports no
torch, it reads the script's. While rank 0 waits, its progress record shows it in "exit_wait" (a
group of its own), so the hang watchdog names the ranks it waits for, not rank 0.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

from dslaunch import progress_record

LINGER_ENV = "DSLAUNCH_STORE_LINGER_S"
KEY = "dslaunch/ranks_left"
# in the progress record: a group of its own, so no rank's sequence numbers are compared with it
RECORD_OP, RECORD_GROUP = "exit_wait", "job end"
_POLL_S = 0.05


def leave(code: int) -> None:
    """Count this rank out; on rank 0 after a clean end, wait for the others (see above)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        if world < 2:
            return
        store = dist.distributed_c10d._get_default_store()
        # a store that is gone (rank 0 failed) answers at once; a stuck one must not hold us
        store.set_timeout(datetime.timedelta(seconds=5))
        left = store.add(KEY, 1)
        if rank != 0 or code != 0:
            return
        deadline = time.monotonic() + float(os.environ.get(LINGER_ENV, "30"))
        record = progress_record.writer() if left < world else None
        if record is not None:  # the hang watchdog sees rank 0 waiting, as in a collective
            record.enter(RECORD_OP, RECORD_GROUP)
        while left < world and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            left = store.add(KEY, 0)
        if record is not None:
            record.leave()
    except Exception:  # at exit: the script's own result stands whatever the store says
        return
