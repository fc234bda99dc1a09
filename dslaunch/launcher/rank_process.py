"""One rank process as this node's agent tracks it: ``agent.py`` starts it and streams its output,
``agent_recovery.py`` promotes a standby into one, ``agent_diagnostics.py`` reads its progress,
memory and stacks."""

from __future__ import annotations

import collections
import subprocess
import threading
import time

from dslaunch.launcher.idleness import Idleness

TAIL_LINES = 20  # the last lines of a rank's output kept for its exit event


class Rank:
    def __init__(self, rank: int, local_rank: int, proc: subprocess.Popen, error_file: str,
                 torch_error_file: str = "", progress_file: str = "", stack_file: str = ""):
        self.rank, self.local_rank, self.proc, self.error_file = rank, local_rank, proc, error_file
        self.torch_error_file = torch_error_file
        # where its progress record and stack dumps go (a promoted standby keeps its stack file)
        self.progress_file, self.stack_file = progress_file, stack_file
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.reader: threading.Thread | None = None
        self.exited = False
        self.idleness = Idleness(time.monotonic())  # the hang watchdog's input (idleness.py)
