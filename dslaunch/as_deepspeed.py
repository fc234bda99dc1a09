"""``import deepspeed`` answered by dslaunch: the ``--as-deepspeed`` switch.

Frameworks (the Hugging Face Trainer, Accelerate, Lightning) import DeepSpeed for their users and
check its package metadata first. With the switch on, in this interpreter:

- ``import deepspeed`` gives a small module whose attributes are the table's ``deepspeed.<name>``
  rows (``deepspeed.initialize`` is ``dslaunch.initialize``), and ``import deepspeed.X`` gives
  the dslaunch module that the public-API table (``deepspeed_names.py``) names for
  ``deepspeed.X``: the same module object, so
  ``deepspeed.zero is dslaunch.zero``. A name the table marks missing fails with its reason; a
  name the table does not know fails saying so. There is no second list of names here.
- ``importlib.metadata`` finds a ``deepspeed`` distribution whose version is ``VERSION``: the
  DeepSpeed release whose API the table follows, with dslaunch's version as the local label
  (``0.19.8+dslaunch.0.1.0``). Version gates (``>= 0.9.3``, ``< 0.14.0``) compare the public part,
  so frameworks take the code paths of the DeepSpeed release we match; the label says who answers.
- If a real DeepSpeed is importable too, dslaunch wins (the switch is the user asking for it) and
  rank 0 says so in one line on stderr, with where the real one is and how to use it instead.

Turned on by ``DSLAUNCH_AS_DEEPSPEED=1`` at interpreter start (``dslaunch_as_deepspeed.pth``,
installed with the package, calls ``install_from_env``), or by ``dslaunch run --as-deepspeed``
(the rank bootstrap calls ``install``). Importing this module imports no torch.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import types
from pathlib import Path

import dslaunch
from dslaunch.deepspeed_names import BY_NAME, DEEPSPEED_VERSION, NAMES, resolve, row

ENV = "DSLAUNCH_AS_DEEPSPEED"
VERSION = f"{DEEPSPEED_VERSION}+dslaunch.{dslaunch.__version__}"
_NOTICED = "DSLAUNCH_AS_DEEPSPEED_NOTICE_GIVEN"  # children of a process that said it stay quiet


def enabled(environ=None) -> bool:
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def target(fullname: str) -> str:
    """The dslaunch module that answers ``import <fullname>`` (a ``deepspeed.*`` module name), or
    ModuleNotFoundError saying why there is none."""
    found = BY_NAME.get(fullname)
    if found is not None and found.present:
        module, _, attr = found.ours.partition(":")
        if not attr:
            return module
        raise ModuleNotFoundError(f"No module named {fullname!r}: it is an attribute; write "
                                  f"`from {fullname.rpartition('.')[0]} import {attr}` "
                                  f"(dslaunch: {found.ours})", name=fullname)
    above = row(fullname)
    if above is None:  # `import deepspeed.launcher` on the way to a row below it
        above = next((n for n in NAMES if n.deepspeed.startswith(fullname + ".")), None)
    if above is not None and not above.present:
        raise ModuleNotFoundError(f"No module named {fullname!r} (dslaunch answers `import "
                                  f"deepspeed`): DeepSpeed's {above.deepspeed} {above.why}",
                                  name=fullname)
    raise ModuleNotFoundError(f"No module named {fullname!r} (dslaunch answers `import deepspeed`):"
                              " dslaunch does not provide this DeepSpeed module; the names it "
                              "provides are listed in docs/porting.md", name=fullname)


def _top_module() -> types.ModuleType:
    """``deepspeed`` itself: dslaunch's names, DeepSpeed's version (Lightning and TRL compare
    ``deepspeed.__version__``)."""
    top = types.ModuleType("deepspeed", "dslaunch answering as DeepSpeed (DSLAUNCH_AS_DEEPSPEED)")
    top.__version__ = VERSION
    top.__file__ = dslaunch.__file__
    top.__path__ = []  # a package, so `import deepspeed.X` asks the finders (this one answers)
    top.__dslaunch__ = dslaunch

    def __getattr__(name):  # the table's deepspeed.<name> rows, nothing else of dslaunch
        found = BY_NAME.get(f"deepspeed.{name}")
        if found is None or name.startswith("__"):
            raise AttributeError(f"module 'deepspeed' has no attribute {name!r} (dslaunch "
                                 "answers `import deepspeed`; docs/porting.md lists its names)")
        if not found.present:
            raise AttributeError(f"module 'deepspeed' has no attribute {name!r}: DeepSpeed's "
                                 f"{found.deepspeed} {found.why}")
        return resolve(found)

    top.__getattr__ = __getattr__
    return top


class _Metadata(importlib.metadata.Distribution):
    """The ``deepspeed`` distribution frameworks look up (``importlib.metadata.version``)."""

    def read_text(self, filename):
        if filename == "METADATA":
            return (f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {VERSION}\n"
                    "Summary: dslaunch answering as DeepSpeed (DSLAUNCH_AS_DEEPSPEED)\n")
        if filename == "top_level.txt":
            return "deepspeed\n"
        return None

    def locate_file(self, path):
        return Path(dslaunch.__file__).parent.parent / path


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on sys.meta_path: answers every ``deepspeed`` / ``deepspeed.*`` import and the
    ``deepspeed`` metadata lookup; nothing else."""

    def __init__(self):
        self._specs = {}  # module name -> the module's own spec, put back after the alias load

    def find_spec(self, fullname, path=None, target_module=None):
        if fullname != "deepspeed" and not fullname.startswith("deepspeed."):
            return None
        if fullname == "deepspeed":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        module = importlib.import_module(target(fullname))
        return importlib.machinery.ModuleSpec(fullname, self, is_package=hasattr(module, "__path__"))

    def create_module(self, spec):
        if spec.name == "deepspeed":
            return _top_module()
        module = importlib.import_module(target(spec.name))
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # The import system stamped the alias spec on dslaunch's module: put its own back, so the
        # module keeps its name, its reload and its pickling (only sys.modules holds the alias).
        own = self._specs.pop(getattr(module.__spec__, "name", None), None)
        if own is not None:
            module.__spec__ = own

    def find_distributions(self, context=None):
        context = context or importlib.metadata.DistributionFinder.Context()
        if context.name is None or context.name.replace("_", "-").lower() == "deepspeed":
            return iter([_Metadata()])
        return iter([])


def real_deepspeed() -> str | None:
    """Where a real DeepSpeed is (its package directory and version), if one is importable."""
    if "deepspeed" in sys.modules and not isinstance(sys.modules["deepspeed"].__spec__.loader,
                                                     AliasFinder):
        module = sys.modules["deepspeed"]
        return f"{getattr(module, '__version__', '?')} at {os.path.dirname(module.__file__ or '?')}"
    spec = importlib.machinery.PathFinder.find_spec("deepspeed")
    if spec is None:
        return None
    where = (list(spec.submodule_search_locations or []) or [spec.origin])[0]
    version = "?"
    for dist in importlib.metadata.MetadataPathFinder.find_distributions(
            importlib.metadata.DistributionFinder.Context(name="deepspeed")):
        version = dist.version
        break
    return f"{version} at {where}"


def install(environ=None) -> AliasFinder:
    """Make ``deepspeed`` mean dslaunch in this interpreter (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, AliasFinder):
            return finder
    real = real_deepspeed()
    imported_real = "deepspeed" in sys.modules
    finder = AliasFinder()
    if imported_real:  # imported before the switch: leave it, the script already holds it
        _notice(f"{ENV}: DeepSpeed {real} was imported before the switch took effect and stays; "
                "`import deepspeed` keeps giving it", environ)
        return finder
    sys.meta_path.insert(0, finder)
    if real is not None:
        _notice(f"{ENV}: `import deepspeed` gives dslaunch {dslaunch.__version__} (as DeepSpeed "
                f"{VERSION}), not the DeepSpeed {real}: the switch asks for dslaunch's engine; "
                f"unset {ENV} (or drop --as-deepspeed) to use that DeepSpeed", environ)
    return finder


def _notice(text: str, environ=None) -> None:
    env = os.environ if environ is None else environ
    if env.get("RANK", "0") != "0" or env.get(_NOTICED):
        return
    os.environ[_NOTICED] = "1"
    sys.stderr.write(f"dslaunch: {text}\n")


def install_from_env() -> None:
    """What the .pth line runs at every interpreter start: nothing unless the switch is on."""
    if enabled():
        install()


def uninstall() -> None:
    """Undo ``install`` (tests): drop the finder and the ``deepspeed`` aliases it answered."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, AliasFinder)]
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
        del sys.modules[name]
