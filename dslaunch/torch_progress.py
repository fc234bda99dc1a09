"""Progress records for scripts that call ``torch.distributed`` directly (plain torch, HF Trainer,
Lightning, Accelerate): every collective, barrier and point-to-point call a rank's main thread
makes is written to its progress record (``progress_record.py``) as dslaunch's own comm layer
writes its calls, so the hang watchdog sees where such a rank is without the script changing.

``install_on_import()`` (the bootstrap calls it when the agent asked for a progress record) waits,
without importing torch, until the script imports ``torch.distributed``; then ``install()`` wraps:

- the collective functions of ``torch.distributed`` (both the package's names and
  ``distributed_c10d``'s, so torch's own helpers such as ``all_gather_object`` go through them):
  each call is ``enter`` (op, group label, per-group sequence number, payload bytes) ... ``leave``;
- ``ProcessGroup``'s collective methods, for code that calls a group directly;
- ``Work.wait``: an async call (``async_op=True``, ``isend``/``irecv``) is shown as issued and left;
  its ``wait()`` shows the rank in that collective again, its sequence number unchanged (the
  engine's ``_TimedWork`` does the same).

Counted once: a call made while the record already shows the rank in a collective (dslaunch's
engine recording its own call, ``all_gather_object`` calling ``all_gather``, ``all_reduce``
calling ``ProcessGroup.allreduce``) is not recorded again. Calls from other threads are not
recorded (the record is the main thread's, as the watchdog's stack is). Names and group labels
are the engine's (``engine/comm/collectives.py``): "world" or "ranks 0-3,8", per-group sequence numbers shared
with the engine's calls, point-to-point under "p2p" (never compared across ranks), so a desync is
seen the same way. Not seen: collectives made from C++ (DDP's gradient buckets, functional
collectives under ``torch.compile``); a rank waiting there is judged by its CPU time.

The record is opened at the first recorded call: until then the agent judges the rank's start
(imports, rendezvous) by its CPU time (``launcher/idleness.py``).
``DSLAUNCH_TORCH_PROGRESS=0`` turns it off. Imports nothing of dslaunch but ``progress_record``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import weakref
import zlib

from dslaunch import progress_record

ENV = "DSLAUNCH_TORCH_PROGRESS"
P2P_GROUP = "p2p"  # as engine/comm/collectives.py: point-to-point calls, numbered per process
_LABEL_WIDTH = 48  # the record's group field

# torch.distributed function -> its name in the record (<= 16 bytes, the record's field). The flat
# forms are named as the engine books them; list forms are marked "[]".
COLLECTIVES = {
    "all_reduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "all_gather": "all_gather[]", "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather", "_all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter[]", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all[]", "all_to_all_single": "all_to_all",
    "gather": "gather", "scatter": "scatter",
    "all_gather_object": "all_gather_obj", "broadcast_object_list": "broadcast_obj",
    "gather_object": "gather_obj", "scatter_object_list": "scatter_obj",
    "all_reduce_coalesced": "all_reduce_coal", "all_gather_coalesced": "all_gather_coal",
}
P2P = {"send": "send", "recv": "recv", "isend": "send", "irecv": "recv",
       "send_object_list": "send_obj", "recv_object_list": "recv_obj",
       "batch_isend_irecv": "batch_p2p"}
# ProcessGroup method -> record name (the group is the object itself)
GROUP_METHODS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coal",
    "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
    "monitored_barrier": "barrier", "allgather": "all_gather[]",
    "allgather_coalesced": "all_gather_coal", "_allgather_base": "all_gather",
    "all_gather_single": "all_gather", "allgather_into_tensor_coalesced": "all_gather_coal",
    "reduce_scatter": "reduce_scatter[]", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scat_coal", "alltoall": "all_to_all[]",
    "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all", "gather": "gather",
    "scatter": "scatter", "send": "send", "recv": "recv", "recv_anysource": "recv",
}
_PAYLOAD = ("tensor", "input_tensor", "input", "tensors", "object_list")  # first found: the bytes

_WRITER: progress_record.ProgressWriter | None = None
_MAIN = threading.main_thread().ident
_ORIGINALS: list = []  # (owner, name, original) to restore on uninstall()
_LABELS: dict = {}  # group object -> label
# async Work -> (op, label, seq, nbytes) until its wait()
_PENDING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_torch = None  # the torch module once installed
# in-process recovery (engine/recovery/guard.ScriptCollectives): what a collective the script
# makes itself does when it fails on a lost peer, or while an abandoned step runs out
SCRIPT_HOOKS = None


# ---- recording ----------------------------------------------------------------------------------
def _writer() -> progress_record.ProgressWriter | None:
    """The record, opened at the first recorded call: until then the rank has none, and the agent
    judges its start (imports, rendezvous) by its CPU time (launcher/idleness.py)."""
    global _WRITER
    if _WRITER is None and _ORIGINALS:
        _WRITER = progress_record.writer()
    return _WRITER


def _label(group) -> str:
    """The group's label, as engine/comm/collectives.group_label makes it (cached per group object)."""
    if group is None:
        return "world"
    label = _LABELS.get(group)
    if label is None:
        label = _make_label(group)
        if len(_LABELS) < 4096:
            _LABELS[group] = label
    return label


def _make_label(group) -> str:
    dist = _torch.distributed
    if group is dist.group.WORLD or not dist.is_initialized():
        return "world"
    try:
        ranks = sorted(dist.get_process_group_ranks(group))
    except (ValueError, RuntimeError, AttributeError):
        return "group"
    return _runs(ranks)


def _runs(ranks: list) -> str:
    runs, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            runs.append(str(start) if start == r else f"{start}-{r}")
            start = None
    text = "ranks " + ",".join(runs)
    if len(text) > _LABEL_WIDTH:  # as the engine: the ends and a digest of the rest
        text = f"ranks {ranks[0]}..{ranks[-1]} n{len(ranks)} {zlib.crc32(text.encode()):08x}"
    return text


def _nbytes(x) -> int:
    if isinstance(x, (list, tuple)):
        x = x[0] if x else None
    if isinstance(x, _torch.Tensor):
        return x.numel() * x.element_size()
    return 0


def _remember(result, op: str, label: str, seq: int, nbytes: int) -> None:
    """An async call's handle(s): their wait() shows the rank in the call again."""
    work_type = _torch._C._distributed_c10d.Work
    for work in (result if isinstance(result, list) else (result,)):
        if isinstance(work, work_type):
            try:
                _PENDING[work] = (op, label, seq, nbytes)
            except TypeError:  # not weakly referenceable: only the issue is shown
                return


def _position(fn, name: str) -> int | None:
    import inspect  # here: the bootstrap imports this module before the script

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index(name) if name in params else None


def _wrap_function(fn, op: str, p2p: bool):
    group_at = _position(fn, "group")
    payload = next((n for n in _PAYLOAD if _position(fn, n) is not None), None)
    payload_at = _position(fn, payload) if payload else None

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        w = _WRITER or _writer()
        if w is None or w.v["coll_op"] or threading.get_ident() != _MAIN:
            return fn(*args, **kwargs)  # nested in a recorded call, or off the main thread
        hooks = SCRIPT_HOOKS
        if hooks is not None and hooks.applies():
            return hooks.call(recorded_call, op, args, kwargs)
        return recorded_call(*args, **kwargs)

    def recorded_call(*args, **kwargs):
        w = _WRITER
        if p2p:
            label = P2P_GROUP
        else:
            group = kwargs.get("group") if group_at is None or len(args) <= group_at \
                else args[group_at]
            label = _label(group)
        nbytes = 0
        if payload_at is not None:
            nbytes = _nbytes(args[payload_at] if len(args) > payload_at else kwargs.get(payload))
        seq = w.enter(op, label, nbytes)
        try:
            result = fn(*args, **kwargs)
        finally:
            w.leave()  # done; an async call: issued (its wait() shows it again)
        if result is not None and not isinstance(result, int):
            _remember(result, op, label, seq, nbytes)
        return result

    recorded.__dslaunch_original__ = fn
    return recorded


def _wrap_method(fn, op: str):
    p2p = op in ("send", "recv")

    @functools.wraps(fn)
    def recorded(self, *args, **kwargs):
        w = _WRITER or _writer()
        if w is None or w.v["coll_op"] or threading.get_ident() != _MAIN:
            return fn(self, *args, **kwargs)
        label, nbytes = P2P_GROUP if p2p else _label(self), _nbytes(args[0]) if args else 0
        seq = w.enter(op, label, nbytes)
        try:
            result = fn(self, *args, **kwargs)
        finally:
            w.leave()  # issued: ProcessGroup calls return a Work
        if result is not None:
            _remember(result, op, label, seq, nbytes)
        return result

    recorded.__dslaunch_original__ = fn
    return recorded


def _wrap_wait(fn):
    @functools.wraps(fn)
    def wait(self, *args, **kwargs):
        w = _WRITER
        if w is None or w.v["coll_op"] or threading.get_ident() != _MAIN:
            return fn(self, *args, **kwargs)
        try:
            entry = _PENDING.pop(self, None)
        except TypeError:
            entry = None
        if entry is None:
            return fn(self, *args, **kwargs)
        op, label, seq, nbytes = entry
        w.resume(op, label, seq, nbytes)
        try:
            return fn(self, *args, **kwargs)
        finally:
            w.leave()

    wait.__dslaunch_original__ = fn
    return wait


# ---- installing -------------------------------------------------------------------------------
def _patch(owner, name: str, new) -> None:
    _ORIGINALS.append((owner, name, owner.__dict__[name] if isinstance(owner, type)
                       else getattr(owner, name)))
    setattr(owner, name, new)


def install(writer: progress_record.ProgressWriter | None = None) -> bool:
    """Wrap torch.distributed's calls (see the module docstring); True when installed. Imports
    ``torch.distributed`` (initialised or not). Does nothing without a progress record to write
    (``writer``, else the agent's ``DSLAUNCH_PROGRESS_FILE``) or when already installed."""
    global _WRITER, _PENDING, _torch
    if _ORIGINALS:
        return True
    if writer is None and not os.environ.get(progress_record.ENV):
        return False
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return False
    _torch = torch
    from torch.distributed import distributed_c10d as c10d

    c10d_native = torch._C._distributed_c10d
    work = c10d_native.Work
    _PENDING = weakref.WeakKeyDictionary()  # torch's Work takes weak references
    for table, p2p in ((COLLECTIVES, False), (P2P, True)):
        for name, op in table.items():
            fn = c10d.__dict__.get(name)
            if fn is None or not callable(fn):
                continue
            wrapped = _wrap_function(fn, op, p2p)
            _patch(c10d, name, wrapped)
            if getattr(dist, name, None) is fn:
                _patch(dist, name, wrapped)
    group_type = c10d_native.ProcessGroup
    for name, op in GROUP_METHODS.items():
        if name in group_type.__dict__:
            _patch(group_type, name, _wrap_method(group_type.__dict__[name], op))
    if "wait" in work.__dict__:
        _patch(work, "wait", _wrap_wait(work.__dict__["wait"]))
    _WRITER = writer  # None: opened at the first call (_writer)
    return True


def uninstall() -> None:
    """Put torch.distributed back as it was (the benchmark's "off" blocks)."""
    global _WRITER
    _WRITER = None
    while _ORIGINALS:
        owner, name, original = _ORIGINALS.pop()
        setattr(owner, name, original)
    _PENDING.clear()


def installed() -> bool:
    return bool(_ORIGINALS)


# ---- waiting for the script's import ---------------------------------------------------------------
class _AfterImport:
    """A meta-path finder that, once ``torch.distributed`` has been executed, calls
    ``install()``; it imports nothing itself and leaves the import to the finders after it."""

    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        try:
            sys.meta_path.remove(self)  # one shot
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_install(module):
            exec_module(module)
            _install_quietly()

        loader.exec_module = exec_then_install
        return spec


def _install_quietly() -> None:
    try:
        install()
    except Exception as exc:  # the recording must never stop the script
        sys.stderr.write(f"dslaunch: torch.distributed calls not recorded for the hang "
                         f"watchdog ({type(exc).__name__}: {exc})\n")


def install_on_import() -> None:
    """Install once the script imports ``torch.distributed`` (at once if it already has); nothing
    without an agent's progress record or with ``DSLAUNCH_TORCH_PROGRESS=0``."""
    if not os.environ.get(progress_record.ENV) or os.environ.get(ENV, "1") == "0":
        return
    if "torch.distributed" in sys.modules:
        _install_quietly()
        return
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
