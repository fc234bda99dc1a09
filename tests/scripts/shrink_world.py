"""The ranks' side of a world that shrinks by one in process, driven without a lost host (the
launcher's side needs namespace hosts: tests/multihost/test_inprocess_hosts.py), for the
in-process recovery scripts (recover_train.py, inprocess_autotp_train.py,
inprocess_pipe_train.py)."""

import os
import sys
import tempfile

from dslaunch.engine.recovery.rejoin import recover
from dslaunch.engine.recovery.watch import Watch


def shrink(engine) -> None:
    """The last rank leaves; the others recover in process with the word a lost host would
    bring (one rank fewer, a new store port): they go on as a world one smaller, or refuse."""
    if engine.global_rank == engine.world_size - 1:
        sys.stdout.flush()
        os._exit(0)
    watch = Watch(os.path.join(tempfile.mkdtemp(), "word"))
    watch.word = {"epoch": 1, "rank": engine.global_rank, "world_size": engine.world_size - 1,
                  "master_addr": os.environ["MASTER_ADDR"],
                  "master_port": int(os.environ["MASTER_PORT"]) + 1}
    recover(engine, watch)
