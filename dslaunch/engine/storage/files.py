"""The checkpoint contract on disk, shared by every writer and reader in this package.

Names: ``<dir>/<tag>/model_states.pt``, ``rank_{r}_optim_states.pt``, ``metadata.json``,
``<dir>/latest``, ``<dir>/zero_to_fp32.py`` (``write_to_fp32_script``); a save in progress lives
in ``<dir>/.<tag>.tmp/``.
Writing (``atomic_torch_save``, ``atomic_text``): under a temporary name (``.part``), fsynced,
then renamed, so a reader never sees half a file. Reading: ``torch.load(weights_only=True)``
always, as a checkpoint may come from someone else; anything missing or unreadable is a
``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import warnings

import torch

TMP_SUFFIX = ".tmp"
CRASH_ENV = "DSLAUNCH_TEST_CRASH_IN_SAVE"  # tests: "after_files[@rank]" dies mid-save (crash_point)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable or does not fit the model."""


def dslaunch_version() -> str:
    try:
        import dslaunch

        return dslaunch.__version__
    except Exception:  # pragma: no cover
        return "unknown"


def model_file(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, "model_states.pt")


def rank_file(ckpt_dir: str, rank: int) -> str:
    return os.path.join(ckpt_dir, f"rank_{rank}_optim_states.pt")


# -- writing -----------------------------------------------------------------------------------

def atomic_torch_save(obj, path: str) -> None:
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_text(path: str, text: str) -> None:
    tmp = path + ".part"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


TO_FP32_SCRIPT = "zero_to_fp32.py"


def write_to_fp32_script(save_dir: str) -> None:
    """Rank 0: ``<save_dir>/zero_to_fp32.py``, the consolidation script that needs only torch
    (DeepSpeed writes its own beside its checkpoints): ``zero_to_fp32_script.py`` stamped with
    this dslaunch's version, written atomically."""
    template = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero_to_fp32_script.py")
    with open(template) as f:
        text = f.read()
    text = text.replace('WRITTEN_BY = "dslaunch (template)"',
                        f'WRITTEN_BY = "dslaunch {dslaunch_version()}"', 1)
    path = os.path.join(save_dir, TO_FP32_SCRIPT)
    atomic_text(path, text)
    os.chmod(path, 0o755)


def publish_dir(tmp: str, final: str) -> None:
    """Put the finished directory ``tmp`` in place of ``final``. A tag saved again is moved aside
    (``.<tag>.old``) and deleted only once the new one is in place, so a crash at any moment
    leaves one whole copy of it."""
    parent = os.path.dirname(final)
    fsync_dir(tmp)
    old = None
    if os.path.exists(final):
        old = os.path.join(parent, "." + os.path.basename(final) + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(parent)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crash_point(name: str, rank: int | None = None) -> None:
    """Test hook: with DSLAUNCH_TEST_CRASH_IN_SAVE=<name> the process dies here (os._exit);
    with <name>@<rank> only that rank dies, by SIGKILL (as kill -9 or a lost host would)."""
    want = os.environ.get(CRASH_ENV)
    if not want:
        return
    if want == name:
        os._exit(17)
    if rank is not None and want == f"{name}@{rank}":
        os.kill(os.getpid(), signal.SIGKILL)


def save_tag(engine, tag) -> str:
    """The tag a save writes (default ``global_step{N}``); it must be a plain directory name."""
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    if os.sep in tag or tag in ("", ".", "..") or tag.startswith("."):
        raise CheckpointError(f"checkpoint tag {tag!r} is not a plain directory name")
    return tag


def start_save_dir(save_dir: str, tag: str, rank: int) -> tuple[str, str]:
    """``(final, tmp)`` directories of a save; rank 0 creates ``tmp`` afresh (a crashed save's
    leftovers are removed). The caller barriers before any rank writes into it."""
    final = os.path.join(save_dir, tag)
    tmp = os.path.join(save_dir, "." + tag + TMP_SUFFIX)
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    return final, tmp


# -- reading -----------------------------------------------------------------------------------

def load_file(path: str, mmap: bool = False, detail: bool = True):
    """``mmap``: map the file instead of reading it (pages are read as tensors are copied out and
    stay in the shared page cache): for files whose tensors are only copied into place.
    ``detail``: the error quotes the exception's first line (the offline tools name its type)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # truncated, not a torch file, unsafe pickle...
        if not detail:
            raise CheckpointError(f"{path}: cannot read checkpoint file ({type(e).__name__})"
                                  ) from None
        raise CheckpointError(f"{path}: cannot read checkpoint file "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                              ) from None


def resolve_tag(load_dir: str, tag=None) -> str:
    """``tag``, or the one ``<load_dir>/latest`` names; its directory must exist."""
    if not os.path.isdir(load_dir):
        raise CheckpointError(f"{load_dir}: checkpoint directory not found")
    if tag is None:
        latest = os.path.join(load_dir, "latest")
        if not os.path.isfile(latest):
            raise CheckpointError(f"{latest}: no 'latest' file; pass tag= to choose a checkpoint")
        with open(latest) as f:
            tag = f.read().strip()
        if not tag:
            raise CheckpointError(f"{latest}: empty 'latest' file")
    path = os.path.join(load_dir, str(tag))
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: checkpoint tag {tag!r} not found")
    return str(tag)


def find_tag(load_dir: str, tag=None):
    """The tag ``engine.load_checkpoint`` loads, or None with a warning when no tag is given and
    ``load_dir`` holds no ``latest`` file (DeepSpeed's "nothing to resume from": the caller
    gets ``(None, None)``). A tag that is named but missing stays an error."""
    latest = os.path.join(load_dir, "latest")
    if tag is None and not os.path.isfile(latest):
        found = sorted(d for d in os.listdir(load_dir) if not d.startswith(".")
                       and os.path.isdir(os.path.join(load_dir, d))) \
            if os.path.isdir(load_dir) else []
        hint = f"; it holds {found[:5]}: pass tag= to load one" if found else ""
        warnings.warn(f"{latest}: no 'latest' file, nothing loaded{hint}", stacklevel=4)
        return None
    return resolve_tag(load_dir, tag)


def read_meta(path: str) -> dict:
    """``<path>/metadata.json`` of a ZeRO 0-3 or pipeline checkpoint."""
    mp = os.path.join(path, "metadata.json")
    try:
        with open(mp) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{mp}: checkpoint metadata not found") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mp}: cannot read checkpoint metadata ({e})") from None


class RankFiles:
    """Lazily opened (mmap'd) rank files of one checkpoint: readers that take a few tensors from
    every rank's file (consolidation, resharding) keep memory of the order of what they copy."""

    def __init__(self, path: str, world: int):
        self.path, self.world, self._open = path, world, {}

    def zero(self, rank: int) -> dict | None:
        """The rank's ZeRO 1-3 shard (``zero_shards.py``), or None (stage 0)."""
        if rank not in self._open:
            sd = load_file(rank_file(self.path, rank), mmap=True, detail=False)
            self._open[rank] = sd
        strat = self._open[rank].get("strategy") or {}
        return strat.get("zero") if isinstance(strat, dict) else None

    def raw(self, rank: int) -> dict:
        self.zero(rank)
        return self._open[rank]
