"""End a rank started by torchrun without gloo's teardown race.

gloo's threads outliving the Python objects they serve made a rank abort at interpreter exit now
and then ("terminate called without an active exception": SIGABRT), failing a run whose work was
done. dslaunch's bootstrap avoids it for its own ranks; reference runs under torchrun call this
last. The ending itself is the benchmarks' (benchutil.end_spawned_worker: barrier, destroy the
groups, flush, ``os._exit(0)``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peer_scripts"))
from benchutil import end_spawned_worker


def exit_cleanly() -> None:
    end_spawned_worker()
