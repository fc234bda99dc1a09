"""``import dslaunch.moe`` (a DeepSpeed module dslaunch does not provide yet) fails with an
ImportError that says what brings it (the row's reason in ``deepspeed_names.py``), never a bare
"No module named". Installed by ``import dslaunch``; the table is read only on such a miss."""

from __future__ import annotations

import importlib.abc
import sys


class _MissingModuleFinder(importlib.abc.MetaPathFinder):
    """Finds nothing, but turns the import of a DeepSpeed module dslaunch does not provide
    (``import dslaunch.moe``) into an ImportError that says what brings it."""

    def find_spec(self, fullname, path=None, target=None):
        # appended after the standard finders: only names no real module answers reach here
        if not fullname.startswith("dslaunch."):
            return None
        from dslaunch.deepspeed_names import row

        deepspeed_name = "deepspeed" + fullname[len("dslaunch"):]
        found = row(deepspeed_name)
        if found is None or found.present:
            return None
        raise ModuleNotFoundError(f"No module named {fullname!r}: DeepSpeed's {deepspeed_name} "
                                  f"{found.why}", name=fullname)


def install_finder() -> None:
    if not any(isinstance(f, _MissingModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MissingModuleFinder())
