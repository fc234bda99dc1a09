"""The DeepSpeed name table: every present row resolves to a real object through the face a
ported script imports, every missing one fails with the reason, and docs/porting.md is current."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from dslaunch import deepspeed_names as names

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("row", [n for n in names.NAMES if n.present], ids=lambda n: n.deepspeed)
def test_present_names_resolve_through_the_public_face(row):
    ours = names.resolve(row)
    module, _, attr = row.dslaunch_name.rpartition(".")
    if row.ours.partition(":")[2]:  # an attribute: the face module must hand out the same object
        assert getattr(importlib.import_module(module), attr) is ours
    else:
        assert importlib.import_module(row.dslaunch_name) is ours


@pytest.mark.parametrize("row", [n for n in names.NAMES if not n.present],
                         ids=lambda n: n.deepspeed)
def test_missing_names_say_what_brings_them(row):
    """A missing module fails to import, a missing attribute of a face fails to resolve, both
    with the row's reason. In a fresh interpreter: the import system caches failed imports."""
    parent, _, attr = row.dslaunch_name.rpartition(".")
    code = f"""
import importlib
try:
    importlib.import_module({row.dslaunch_name!r})
    print("imported")
except ImportError as e:
    print("ImportError", e)  # a missing module
    try:
        face = importlib.import_module({parent!r})
    except ImportError:
        pass
    else:  # or a missing attribute of a face
        try:
            getattr(face, {attr!r})
            print("resolved")
        except AttributeError as e2:
            print("AttributeError", e2)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT).stdout
    assert row.why in out and out.split()[0] in ("ImportError", "AttributeError"), out


def test_a_module_of_ours_is_never_hidden_by_the_table():
    import dslaunch.config  # noqa: F401  (no row: the finder stays out of the way)


def test_porting_page_is_generated_from_the_table():
    page = (ROOT / "docs" / "porting.md").read_text()
    assert names.render_porting(page) == page, \
        "docs/porting.md is stale: run `python -m dslaunch.deepspeed_names docs/porting.md`"
    for row in names.NAMES:
        assert f"`{row.deepspeed}`" in page
