"""Launch-time probe: init_process_group (gloo), barrier, exit. Runs under any launcher.

Each rank writes ``<stamps>/rank<N>.json`` with wall-clock times (time.time()) of: script start
(before importing torch), torch imported, process group ready, barrier passed, and, with
``--fail-rank R``, the moment rank R raises (after the barrier; the other ranks then sleep, so the
launcher has to notice the failure and stop them).
"""

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402, F401
import torch.distributed as dist  # noqa: E402

T_IMPORT = time.time()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stamps", default=None, help="directory for rank<N>.json time stamps")
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--sleep-after-fail", type=float, default=120.0)
    args, _ = p.parse_known_args()  # the deepspeed launcher appends --local_rank
    dist.init_process_group("gloo")
    t_init = time.time()
    rank = dist.get_rank()
    dist.barrier()
    t_barrier = time.time()
    stamps = {"rank": rank, "world_size": dist.get_world_size(), "pid": os.getpid(), "start": T_START,
              "torch_imported": T_IMPORT, "init_done": t_init, "barrier_done": t_barrier}

    def write(extra=None):
        if args.stamps:
            os.makedirs(args.stamps, exist_ok=True)
            path = os.path.join(args.stamps, f"rank{rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({**stamps, **(extra or {})}, f)
            os.replace(path + ".tmp", path)

    if args.fail_rank is None:
        dist.destroy_process_group()
        write({"exit": time.time()})
        return
    if rank == args.fail_rank:
        write({"failed_at": time.time()})
        raise RuntimeError(f"rank {rank}: deliberate failure for the launch benchmark")
    write()
    time.sleep(args.sleep_after_fail)  # the launcher must stop us


if __name__ == "__main__":
    main()
