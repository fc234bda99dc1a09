"""Every rank prints LONG_LINES lines of several kilobytes (non-ASCII included), paced so that the
ranks of both hosts write at the same time, then exits: the lines and the exit events must cross a
shared stream (srun, mpirun) whole."""

import os
import time

rank = int(os.environ["RANK"])
count = int(os.environ.get("LONG_LINES", "150"))
for i in range(count):
    # "é" is two bytes: a cut at a fixed byte count falls inside one somewhere
    print(f"LONG {rank} {i} " + ("é" * 700 + "x" * 1300) * 2 + " END", flush=True)
    time.sleep(0.01)  # 1.5 s in all: longer than the hosts' start-up skew
