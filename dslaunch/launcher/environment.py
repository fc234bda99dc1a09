"""Which environment variables go to every rank on every host, and where each came from.

Sources, later ones winning:

1. the launcher's own environment: names starting with one of ``PREFIXES`` or equal to one of
   ``EXACT`` (minus ``NEVER_FROM_ENVIRON``);
2. env files in the home directory, then in the working directory: DeepSpeed's ``.deepspeed_env``
   (or the file named by ``DS_ENV_FILE``), then ``.dslaunch_env`` (ours wins within a directory);
3. ``--env KEY=VALUE`` on the command line.

Values are taken literally and kept byte-identical: no quote removal, no ``$VAR`` / backtick /
``$(...)`` expansion, ever (DeepSpeed's launcher pastes them into a shell line, which runs commands
hidden in values). They travel to the ranks as data inside the encoded plan.

Deliberately NOT propagated from the launcher's environment (add them with ``--env`` or an env file
when a cluster really wants them):

- ``PATH``, ``LD_LIBRARY_PATH``, ``HOME``, ``USER``...: they describe the launching host's layout
  and login; each host's login environment sets its own, and the remote interpreter is invoked by
  absolute path, so ``PATH`` is not needed to find it.
- ``PYTHONHOME`` / ``PYTHONEXECUTABLE``: they point an interpreter at an installation; the remote
  interpreter is chosen with ``--python``. (Other ``PYTHON*`` such as ``PYTHONPATH``,
  ``PYTHONUNBUFFERED``, ``PYTHONHASHSEED``, ``PYTHONWARNINGS`` do go, as in DeepSpeed.)
- ``CUDA_VISIBLE_DEVICES`` (and the ROCm / oneAPI equivalents): the agent sets it on each host from
  that host's selected slots; the launching host's value means nothing elsewhere.
- The names the launcher sets for each rank (``RESERVED``): set by ``--env`` or a file they are an
  error, found in the environment they are skipped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

PREFIXES = (
    "NCCL_", "GLOO_", "UCX_", "MV2_", "FI_", "OMPI_MCA_", "PSM2_", "I_MPI_",   # transports
    "PYTHON",                                                               # PYTHONPATH & co.
    "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_",                           # CPU threading
    "CUDA_", "NVIDIA_", "HIP_", "ROCM_", "HSA_",                            # accelerators
    "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "PYTORCH_",                 # torch
    "HF_", "TRANSFORMERS_", "TOKENIZERS_",                                  # Hugging Face
    "MLFLOW_", "WANDB_", "TENSORBOARD_",                                    # tracking
    "DSLAUNCH_", "DS_",                                                     # ours, DeepSpeed's
)
EXACT = ("TOKENIZERS_PARALLELISM",)
NEVER_FROM_ENVIRON = frozenset({
    "PYTHONHOME", "PYTHONEXECUTABLE", "PYTHONSTARTUP",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "DS_ENV_FILE",
})
RESERVED = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "DSLAUNCH_CONFIG", "DSLAUNCH_CONFIG_PATH", "DSLAUNCH_RESTART_COUNT",
    # torchrun's (agent.py: rank_env) and DeepSpeed's launch.py's per-rank names
    "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
})
ENV_FILE_NAMES = (".deepspeed_env", ".dslaunch_env")
# Names that usually hold credentials: a plan printer may mask their values.
_SECRET_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.I)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class EnvError(ValueError):
    """A bad ``--env`` value or env-file line; the message names ``--env`` or ``file:line``."""


def is_secret(name: str) -> bool:
    """True for names that usually hold credentials (e.g. HF_TOKEN, WANDB_API_KEY)."""
    return bool(_SECRET_RE.search(name))


def _from_environ(name: str) -> str | None:
    """The rule that propagates ``name`` from the launcher's environment, or None."""
    if name in NEVER_FROM_ENVIRON or name in RESERVED:
        return None
    if name in EXACT:
        return "environ"
    for p in PREFIXES:
        if name.startswith(p):
            return f"environ (prefix {p})"
    return None


def _split_assignment(text: str, where: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise EnvError(f"{where}: expected KEY=VALUE, got {text!r}")
    if not _NAME_RE.match(name):
        raise EnvError(f"{where}: invalid variable name {name!r} (letters, digits and '_', "
                       "not starting with a digit)")
    if name in RESERVED:
        raise EnvError(f"{where}: {name} is set by the launcher for each rank and cannot be overridden")
    if "\0" in value:
        raise EnvError(f"{where}: value of {name} contains a NUL byte")
    return name, value


def _display(path: Path, cwd: Path, home: Path) -> str:
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        pass
    try:
        return "./" + str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def read_env_file(path: Path, shown: str) -> list[tuple[str, str, str]]:
    """``[(name, value, "shown:LINE")]`` from one env file. Blank lines and whole-line ``#``
    comments are skipped; ``export KEY=VALUE`` is accepted; the value is everything after the first
    ``=`` up to the end of the line, literally (a trailing CR of a CRLF line is dropped)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EnvError(f"{shown}: cannot read env file: {exc.strerror}") from None
    text = data.decode("utf-8", "surrogateescape")
    out = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export ") or stripped.startswith("export\t"):
            stripped = stripped[len("export"):].lstrip()
        where = f"{shown}:{lineno}"
        name, value = _split_assignment(stripped, where)
        out.append((name, value, where))
    return out


def env_files(cwd: Path, home: Path, environ=os.environ) -> list[Path]:
    """The env files that exist, in the order they are applied (later wins)."""
    names = list(ENV_FILE_NAMES)
    ds_name = environ.get("DS_ENV_FILE")
    if ds_name:
        names[0] = ds_name
    found: list[Path] = []
    seen: set[Path] = set()
    for d in (home, cwd):
        for n in names:
            p = Path(d) / n  # an absolute DS_ENV_FILE replaces the directory
            try:
                key = p.resolve()
            except OSError:
                key = p
            if key in seen:
                continue
            seen.add(key)
            if p.is_file():
                found.append(p)
    if ds_name and not any((Path(d) / ds_name).is_file() for d in (home, cwd)):
        raise EnvError(f"DS_ENV_FILE={ds_name}: no such file in {home} or {cwd}")
    return found


def collect_env(cli_env: list[str], cwd: Path, home: Path,
                environ=os.environ) -> dict[str, tuple[str, str]]:
    """``{name: (value, source)}`` of every variable to set on every rank; raises EnvError."""
    cwd, home = Path(cwd), Path(home)
    result: dict[str, tuple[str, str]] = {}
    for name in sorted(environ):
        rule = _from_environ(name)
        if rule:
            result[name] = (environ[name], rule)
    for path in env_files(cwd, home, environ):
        for name, value, where in read_env_file(path, _display(path, cwd, home)):
            result[name] = (value, where)
    for item in cli_env or ():
        name, value = _split_assignment(item, "--env")
        result[name] = (value, "--env")
    return result
