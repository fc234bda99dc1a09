"""Runs one rank's program unchanged: ``python -m dslaunch.launcher.bootstrap [--error-file F]
[--cpus LIST] [-m module | script] args...``.

- The script runs as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` set as ``python script``
  would set them (``-m``: as ``python -m`` would), so user code cannot tell the difference.
- An uncaught exception is written, with its full traceback, the rank and the time, to the error
  file the agent reads (what torchrun needs ``@record`` for), then printed as Python would print
  it, and the rank exits 1.
- SIGUSR1 dumps every thread's Python stack to stderr (faulthandler): the agent sends it before
  stopping ranks after a failure, so a hung rank shows where it was stuck.
- SIGUSR2 appends the same dump to the file named by ``DSLAUNCH_STACK_FILE`` (set by the agent):
  how the agent captures a live rank's stacks for the hang watchdog's report, without stopping it.
- The rank leaves as the interpreter would (non-daemon threads joined, atexit handlers run, stdio
  flushed) but skips the interpreter's final teardown: C++ objects that own threads (gloo's
  process groups) are destroyed there in arbitrary order and can call std::terminate, which
  turned ranks that had finished their work into SIGABRT failures.
- ``--cpus 0-3``: the rank is pinned to those cores first (``--bind_cores_to_rank``, cores.py).
- ``--local_rank`` is NOT added to argv here (torchrun does not either): LOCAL_RANK is in the env,
  and a script that declares ``--local_rank`` with a default keeps working. ``dslaunch run
  --as-deepspeed`` has the agent add it, as DeepSpeed's launcher does.
- With a progress record to write (``DSLAUNCH_PROGRESS_FILE``, set by the agent), every
  ``torch.distributed`` collective the script's main thread calls is recorded there for the hang
  watchdog, from the moment the script imports torch (``dslaunch/torch_progress.py``): plain
  torch, HF Trainer, Lightning or Accelerate scripts are watched as dslaunch's engine is.
- With DSLAUNCH_AS_DEEPSPEED set (``--as-deepspeed``), ``import deepspeed`` means dslaunch before
  the script runs (dslaunch/as_deepspeed.py), whether or not the package's .pth is installed.

- Rank 0 hosts the job's TCP store (env://): at the end it waits until every rank has counted
  itself out on it, so a rank still using the store after rank 0's work is done does not lose it
  (dslaunch/store_linger.py).
- A standby process (in-process recovery) runs at a lower CPU priority until it is promoted
  (dslaunch/standby_priority.py).

No torch here: the rank's own script decides what to import.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

from dslaunch import standby_priority, store_linger
from dslaunch.recover_files import STANDBY_ENV

USAGE = ("usage: python -m dslaunch.launcher.bootstrap [--error-file FILE] [--cpus LIST] "
         "[-m MODULE | SCRIPT] [ARGS...]")


def _parse(argv: list) -> tuple:
    """(error_file, cpus, module, script, args): our own options come first, then the program."""
    opts = {"--error-file": None, "--cpus": None}
    while argv and argv[0].split("=", 1)[0] in opts:
        name, eq, value = argv[0].partition("=")
        if eq:
            opts[name], argv = value, argv[1:]
        elif len(argv) > 1:
            opts[name], argv = argv[1], argv[2:]
        else:
            raise SystemExit(USAGE)
    error_file, cpus = opts["--error-file"], opts["--cpus"]
    if argv and argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(USAGE)
        return error_file, cpus, argv[1], None, argv[2:]
    if not argv:
        raise SystemExit(USAGE)
    return error_file, cpus, None, argv[0], argv[1:]


def _user_traceback(exc: BaseException) -> str:
    """The traceback without this module's and runpy's frames (the user never called them)."""
    tb = exc.__traceback__
    skip = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}

    def ours(name: str) -> bool:
        return name in skip or os.path.abspath(name) in skip

    while tb is not None and ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _write_error_file(path: str, exc: BaseException, text: str) -> None:
    record = {
        "rank": os.environ.get("RANK"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "pid": os.getpid(),
        "time": time.time(),
        "exc_type": type(exc).__name__,
        "message": str(exc),
        "traceback": text,
    }
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)  # the agent never reads a half-written file
    except OSError:
        pass  # the error still reaches stderr below


def main(argv: list | None = None) -> None:
    error_file, cpus, module, script, args = _parse(list(sys.argv[1:] if argv is None else argv))
    if cpus:
        from dslaunch.launcher.cores import parse_core_list

        # before the script starts any thread: every thread it makes inherits the set
        os.sched_setaffinity(0, parse_core_list(cpus))
    if os.environ.get(STANDBY_ENV):
        standby_priority.lower()  # until promoted (engine/comm/membership.await_promotion)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    _register_stack_file()
    from dslaunch.torch_progress import install_on_import  # imports no torch

    install_on_import()
    if os.environ.get("DSLAUNCH_AS_DEEPSPEED"):
        from dslaunch.as_deepspeed import install_from_env  # imports no torch

        install_from_env()
    try:
        if module is not None:
            # python -m puts the cwd first on sys.path; run_module(alter_sys) sets argv[0] itself.
            sys.path[0] = os.getcwd()
            sys.argv = [module, *args]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            sys.argv = [script, *args]
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc.code)
    except BaseException as exc:
        text = _user_traceback(exc)
        if error_file:
            _write_error_file(error_file, exc, text)
        sys.stderr.write(text)
        # Exit as Python would: 130 after Ctrl-C, 1 otherwise.
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    _leave(code)


STACK_FILE_ENV = "DSLAUNCH_STACK_FILE"
_STACK_FILE = None  # kept open: faulthandler writes to its descriptor from the signal handler


def _register_stack_file() -> None:
    global _STACK_FILE
    path = os.environ.pop(STACK_FILE_ENV, None)  # popped: the script's children have their own
    if not path or not hasattr(signal, "SIGUSR2"):
        return
    try:
        _STACK_FILE = open(path, "ab", buffering=0)
    except OSError:  # still handled (to stderr): SIGUSR2's default action would end the rank
        _STACK_FILE = sys.stderr
    faulthandler.register(signal.SIGUSR2, file=_STACK_FILE, all_threads=True, chain=False)


def _exit_status(code) -> int:
    """The status ``sys.exit(code)`` gives: None -> 0, an int as is, anything else printed -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def _leave(code: int) -> None:
    """Exit like the interpreter, without its final teardown (see the module docstring)."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    store_linger.leave(code)  # before atexit: the engine's handler destroys the group
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
