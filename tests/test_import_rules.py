"""The one-way import rules between dslaunch's rooms, read from the source with ``ast`` (nothing
is imported, so this runs in well under a second and needs no torch).

What counts as an import of module M by module I (``Import``; ``lazy`` when inside a function):
``import a.b``; ``from a import b`` (a.b when that is a module, else a); the relative forms
(``from . import x``, ``from ..kernels import builder``) resolved against I's package; the string
argument of ``importlib.import_module(...)`` / ``__import__(...)`` (a literal; an f-string with
``__name__`` / ``__package__`` filled in and other holes as ``*``, expanded to the modules that
match; a module-level dict of literals subscripted, as a registry does; a name bound to
a literal); and, after ``import dslaunch``, the attribute ``dslaunch.X`` where X is one of the
package's lazy names (dslaunch/__init__.py ``_LAZY`` / ``_LAZY_MODULES``), which imports it
through ``__getattr__``. A dynamic import this cannot resolve is reported under a ruled room
(it cannot be checked). Imports under ``if TYPE_CHECKING:`` are counted like any other.

The layout (dslaunch/): ``launcher/`` (start ranks anywhere), ``config/`` (pure data),
``engine/`` (the training runtime), ``kernels/`` (compiled ops), ``nvme/`` (the async I/O handle
over a kernel op, used by engine/zero), ``cli/`` (the command, may use every room lazily), and
the public faces: ``dslaunch/__init__.py`` (lazy names), ``dslaunch/zero.py``, ``dslaunch/pipe.py``
(and any future face module ``dslaunch/<name>.py`` or face package). The rules, from
docs/architecture.md ("One-way rules") and docs/interfaces.md, as the code keeps them today:

- launcher: imports, at any level, only ``dslaunch`` (the package, for ``__version__``),
  ``dslaunch.launcher.*`` and ``dslaunch.config.*`` of dslaunch, ``dslaunch.as_deepspeed``
  (the bootstrap turns on the ``--as-deepspeed`` alias; it imports only the names table) and
  ``dslaunch.torch_progress`` (the bootstrap hooks the script's ``torch.distributed`` import to
  record its collectives; that module imports torch only inside the hook), the leaves
  ``dslaunch.progress_record``, ``dslaunch.recover_files`` and ``dslaunch.standby_priority``
  (shared with the engine, no torch), ``dslaunch.store_linger`` (no torch import: it uses the
  script's ``torch.distributed`` from ``sys.modules``), and
  never torch, not even inside a function: the agent starts ranks without torch (the code has no
  lazy torch import here, so none is allowed).
- engine: imports of dslaunch only ``dslaunch.engine.*``, ``dslaunch.config.*``,
  ``dslaunch.kernels.*``, ``dslaunch.nvme.*``, ``dslaunch.accelerator.*`` (the device interface, a
  real module of its own, not a face) and the bare package ``dslaunch`` (``__version__``),
  at any level: never the launcher, the CLI, a public face (``dslaunch.zero``, ``dslaunch.pipe``,
  a lazy name of ``dslaunch/__init__``) — faces point at the engine, not back.
- config: imports of dslaunch only ``dslaunch.config.*``, and never torch at any level (pure
  data; the launcher and the CLI use it and must start fast).
- accelerator: imports of dslaunch only ``dslaunch.accelerator.*``, ``dslaunch.kernels.*`` (its
  op builders load our compiled ops) and ``dslaunch.deepspeed_names`` (its missing-name errors).
- kernels: imports of dslaunch only ``dslaunch.kernels.*`` (a leaf: it knows nothing of the
  engine; torch is its business, at any level).
- cli: no torch at module level (docs/interfaces.md); it imports the engine inside functions.
- start-up, transitively: following module-level imports only (and the ``__init__`` of every
  package on the way), no module of launcher/, config/ or cli/ reaches torch, and none of
  launcher/ reaches the engine or the kernels.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ROOT

PKG = ROOT / "dslaunch"

# Violations on the current code that another change is removing, each as (importer module,
# imported module, rule). The test fails on any violation not listed here, and on an entry that
# is no longer found, so the set shrinks with the code: remove an entry when its fix lands.
# Empty now: this test was written on 8557079, where engine/zero/stage12.py:122 and
# engine/zero/stage3.py:106,118,140 imported the public face dslaunch.zero (rule "engine");
# 249081b moved that code to engine/zero/zero_init.py, and the test then asked for the two
# entries to be removed, which they were.
KNOWN_VIOLATIONS: set = set()


@dataclass(frozen=True)
class Import:
    file: str  # path relative to the repository
    line: int
    importer: str
    imported: str
    lazy: bool  # inside a function (runs when called, not at import)

    def __str__(self):
        return (f"{self.file}:{self.line}: {self.importer} -> {self.imported}"
                f"{' (in a function)' if self.lazy else ''}")


@dataclass(frozen=True)
class Violation:
    imp: Import
    rule: str
    why: str

    @property
    def key(self):
        return (self.imp.importer, self.imp.imported, self.rule)

    def __str__(self):
        return f"{self.imp}  [{self.rule}: {self.why}]"


# -- reading the imports -------------------------------------------------------------------------

def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules(pkg: Path = PKG) -> dict:
    """{module name: path} of every .py file under dslaunch/."""
    return {module_name(p): p for p in sorted(pkg.rglob("*.py"))}


def lazy_names(init_source: str) -> set:
    """The names dslaunch/__init__.py serves through __getattr__ (_LAZY keys, _LAZY_MODULES)."""
    names = set()
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in ("_LAZY", "_LAZY_MODULES"):
            value = ast.literal_eval(node.value)
            names |= set(value)
    return names


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(source: str, importer: str, *, is_package: bool = False, file: str = "?",
               known: set = frozenset(), lazy: set = frozenset(),
               root_pkg: str = "dslaunch") -> list:
    """Every import of ``importer`` (module name) in ``source``, resolved to absolute names.
    ``known``: the existing module names (``from a import b`` -> a.b when a.b is one; f-string
    patterns expand to them). ``lazy``: the root package's lazy names."""
    tree = ast.parse(source)
    package = importer if is_package else importer.rpartition(".")[0]
    consts, dicts = {}, {}  # module-level names bound to a str literal / a dict of str literals
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, str):
                consts[node.targets[0].id] = value
            elif isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
                dicts[node.targets[0].id] = list(value.values())
    out = []

    def add(node, name, in_func):
        out.append(Import(file, node.lineno, importer, name, in_func))

    def add_pattern(node, pattern, in_func):
        matches = sorted(m for m in known if fnmatch.fnmatchcase(m, pattern))
        for m in matches or [pattern]:
            add(node, m, in_func)

    def dynamic(node, arg, in_func):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            name = arg.value
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                name = _resolve_relative(importer, is_package, level, name.lstrip(".") or None)
            return add(node, name, in_func)
        if isinstance(arg, ast.JoinedStr):
            parts = []
            for v in arg.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                elif isinstance(v.value, ast.Name) and v.value.id == "__name__":
                    parts.append(importer)
                elif isinstance(v.value, ast.Name) and v.value.id == "__package__":
                    parts.append(package)
                else:
                    parts.append("*")
            return add_pattern(node, "".join(parts), in_func)
        if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) and \
                arg.value.id in dicts:
            for name in dicts[arg.value.id]:
                add(node, name, in_func)
            return None
        if isinstance(arg, ast.Name) and arg.id in consts:
            return add(node, consts[arg.id], in_func)
        return add(node, f"<dynamic: {ast.unparse(arg)}>", in_func)

    root_aliases = set()  # names bound to the root package by `import dslaunch [as x]`

    def visit(node, in_func):
        for child in ast.iter_child_nodes(node):
            f = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for a in child.names:
                    add(child, a.name, in_func)
                    if a.name == root_pkg:
                        root_aliases.add(a.asname or a.name)
            elif isinstance(child, ast.ImportFrom):
                base = (_resolve_relative(importer, is_package, child.level, child.module)
                        if child.level else child.module)
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    if sub in known or (base == root_pkg and a.name in lazy):
                        add(child, sub, in_func)  # a module, or a lazy name of the package
                    else:
                        add(child, base, in_func)
            elif isinstance(child, ast.Call) and child.args and (
                    (isinstance(child.func, ast.Attribute) and child.func.attr == "import_module")
                    or (isinstance(child.func, ast.Name)
                        and child.func.id in ("import_module", "__import__"))):
                dynamic(child, child.args[0], in_func)
            visit(child, f)

    visit(tree, False)
    # after `import dslaunch`: dslaunch.<lazy name> goes through the package's __getattr__
    for node, in_func in _attributes(tree):
        if isinstance(node.value, ast.Name) and node.value.id in root_aliases and \
                node.attr in lazy:
            add(node, f"{root_pkg}.{node.attr}", in_func)
    return sorted(set(out), key=lambda i: (i.line, i.imported))


def _attributes(tree):
    def walk(node, in_func):
        for child in ast.iter_child_nodes(node):
            f = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Attribute):
                yield child, in_func
            yield from walk(child, f)
    yield from walk(tree, False)


def read_all(pkg: Path = PKG) -> list:
    mods = all_modules(pkg)
    lazy = lazy_names((pkg / "__init__.py").read_text())
    out = []
    for name, path in mods.items():
        out += imports_of(path.read_text(), name, is_package=path.name == "__init__.py",
                          file=str(path.relative_to(ROOT)), known=set(mods), lazy=lazy)
    return out


# -- the rules ---------------------------------------------------------------------------------

def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _is_torch(name: str) -> bool:
    return _under(name, "torch")


# rule: (the importer's room, the dslaunch modules it may import, torch: "any" | "lazy" | "none")
RULES = {
    "launcher": ("dslaunch.launcher", ("dslaunch.launcher", "dslaunch.config",
                                       "dslaunch.as_deepspeed", "dslaunch.progress_record",
                                       "dslaunch.torch_progress", "dslaunch.recover_files",
                                       "dslaunch.standby_priority", "dslaunch.store_linger"),
                 "none"),
    # the rank side of the hang watchdog for plain torch.distributed scripts: the progress record
    # only, torch inside functions (the hook runs once the script imports torch.distributed)
    "torch_progress": ("dslaunch.torch_progress", ("dslaunch.progress_record",), "lazy"),
    # (torch_progress, a leaf: in-process recovery hands it the hooks for the script's own
    # collectives, engine/recovery/guard.ScriptCollectives)
    "engine": ("dslaunch.engine", ("dslaunch.engine", "dslaunch.config", "dslaunch.kernels",
                                   "dslaunch.nvme", "dslaunch.accelerator",
                                   "dslaunch.progress_record", "dslaunch.recover_files",
                                   "dslaunch.torch_progress", "dslaunch.standby_priority"), "any"),
    # the rank -> agent progress channel: a leaf both sides share
    "progress_record": ("dslaunch.progress_record", (), "none"),
    # the agent <-> rank files of an in-process recovery: a leaf both sides share
    "recover_files": ("dslaunch.recover_files", (), "none"),
    # a standby's CPU priority: the bootstrap lowers it, in-process recovery restores it; a leaf
    "standby_priority": ("dslaunch.standby_priority", (), "none"),
    # rank 0 keeps the store up until every rank has left: the bootstrap's, torch only as the
    # script imported it (sys.modules), never imported here
    "store_linger": ("dslaunch.store_linger", ("dslaunch.progress_record",), "none"),
    "accelerator": ("dslaunch.accelerator", ("dslaunch.accelerator", "dslaunch.kernels",
                                             "dslaunch.deepspeed_names"), "any"),
    "config": ("dslaunch.config", ("dslaunch.config",), "none"),
    "kernels": ("dslaunch.kernels", ("dslaunch.kernels",), "any"),
    "cli": ("dslaunch.cli", None, "lazy"),  # None: any dslaunch module
}


def check(imports: list) -> list:
    """The violations of RULES among ``imports`` (direct imports only)."""
    bad = []
    for imp in imports:
        for rule, (room, allowed, torch_ok) in RULES.items():
            if not _under(imp.importer, room):
                continue
            name = imp.imported
            if name.startswith("<dynamic"):
                bad.append(Violation(imp, rule, "a dynamic import this test cannot resolve"))
            elif _is_torch(name):
                if torch_ok == "none":
                    bad.append(Violation(imp, rule, "no torch here, not even in a function"))
                elif torch_ok == "lazy" and not imp.lazy:
                    bad.append(Violation(imp, rule, "torch only inside functions"))
            elif allowed is not None and _under(name, "dslaunch") and name != "dslaunch" and \
                    not _under(name, *allowed):
                bad.append(Violation(imp, rule, f"may import only {', '.join(allowed)} "
                                                "of dslaunch"))
    return bad


def check_startup(imports: list, modules: set) -> list:
    """Module-level imports followed transitively (with every package __init__ on the way):
    launcher/config/cli modules must not reach torch; launcher modules not the engine/kernels."""
    graph: dict = {}
    first: dict = {}  # (importer, imported) -> the Import, for the report
    for imp in imports:
        if imp.lazy:
            continue
        graph.setdefault(imp.importer, set()).add(imp.imported)
        first.setdefault((imp.importer, imp.imported), imp)

    def deps(name):
        out = set(graph.get(name, ()))
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b.c runs a/__init__ and a/b/__init__
            parent = ".".join(parts[:i])
            if parent in modules:
                out.add(parent)
        return out

    bad = []
    for start in sorted(m for m in modules
                        if _under(m, "dslaunch.launcher", "dslaunch.config", "dslaunch.cli")):
        seen, stack, path_to = {start}, [start], {start: [start]}
        while stack:
            cur = stack.pop()
            for nxt in sorted(deps(cur)):
                if nxt in seen:
                    continue
                seen.add(nxt)
                path_to[nxt] = path_to[cur] + [nxt]
                forbidden = _is_torch(nxt) or (_under(start, "dslaunch.launcher") and
                                               _under(nxt, "dslaunch.engine", "dslaunch.kernels"))
                if forbidden:
                    chain = path_to[nxt]
                    imp = first.get((chain[-2], nxt)) or Import("?", 0, chain[-2], nxt, False)
                    bad.append(Violation(Import(imp.file, imp.line, start, nxt, False),
                                         "start-up", "reached at import via "
                                         + " -> ".join(chain)))
                elif nxt in modules:
                    stack.append(nxt)
    return bad


# -- the tests ------------------------------------------------------------------------------------

def test_import_rules_hold():
    imports = read_all()
    found = check(imports) + check_startup(imports, set(all_modules()))
    keys = {v.key for v in found}
    new = [v for v in found if v.key not in KNOWN_VIOLATIONS]
    fixed = sorted(KNOWN_VIOLATIONS - keys)
    lines = [f"{'known' if v.key in KNOWN_VIOLATIONS else 'NEW  '} {v}" for v in found]
    lines += [f"FIXED {k}: no longer found, remove it from KNOWN_VIOLATIONS" for k in fixed]
    assert not new and not fixed, "import rules (tests/test_import_rules.py):\n" + "\n".join(lines)


def test_the_scan_sees_the_package():
    """Not vacuous on the real code: every room is read, and imports of each form are found
    (function-level, relative, from-package-import-module, import_module of a literal; the
    other forms are covered by test_imports_of_resolves_every_form)."""
    imports = read_all()
    mods = all_modules()
    assert {"dslaunch.launcher.agent", "dslaunch.engine.core.engine", "dslaunch.config.schema",
            "dslaunch.kernels.builder", "dslaunch.cli.run"} <= set(mods)
    pairs = {(i.importer, i.imported, i.lazy) for i in imports}
    assert ("dslaunch.cli.ckpt", "dslaunch.engine.storage.files", True) in pairs  # in a function
    assert ("dslaunch.config", "dslaunch.config.errors", False) in pairs  # from .errors import
    assert ("dslaunch", "dslaunch.deepspeed_names", True) in pairs  # import_module in __getattr__
    assert ("dslaunch.launcher.runners", "dslaunch.launcher.runners.slurm", False) in pairs
    assert ("dslaunch.kernels.cpu_optim", "torch", False) in pairs


FAKE_KNOWN = {"dslaunch", "dslaunch.zero", "dslaunch.launcher", "dslaunch.launcher.plan",
              "dslaunch.launcher.fake", "dslaunch.engine", "dslaunch.engine.comm",
              "dslaunch.engine.fake", "dslaunch.engine.zero", "dslaunch.engine.zero.stage2",
              "dslaunch.kernels", "dslaunch.kernels.builder", "dslaunch.config",
              "dslaunch.config.fake", "dslaunch.config.errors", "dslaunch.kernels.fake"}
FAKE_LAZY = {"initialize", "zero", "pipe"}


def _fake(source, importer, is_package=False):
    return imports_of(source, importer, is_package=is_package, file=f"{importer}.py",
                      known=FAKE_KNOWN, lazy=FAKE_LAZY)


def test_imports_of_resolves_every_form():
    src = """
import os, dslaunch.engine.comm as c
from . import plan
from .. import engine
from ..kernels import builder
import importlib
from importlib import import_module
M = "dslaunch.kernels"
REG = {"a": "dslaunch.config.errors"}
def f(k):
    import torch
    importlib.import_module("dslaunch.zero")
    import_module(REG[k])
    __import__(M)
    importlib.import_module(f"{__package__}.pl{k}")
    importlib.import_module(k + "x")
"""
    got = {(i.imported, i.lazy) for i in _fake(src, "dslaunch.launcher.fake")}
    assert got == {("os", False), ("dslaunch.engine.comm", False),
                   ("dslaunch.launcher.plan", False), ("dslaunch.engine", False),
                   ("dslaunch.kernels.builder", False), ("importlib", False),
                   ("torch", True), ("dslaunch.zero", True), ("dslaunch.config.errors", True),
                   ("dslaunch.kernels", True), ("dslaunch.launcher.plan", True),
                   ("<dynamic: k + 'x'>", True)}
    # a package's own `from . import x` is its child; `from dslaunch import <lazy>` the face
    got = {i.imported for i in _fake("from . import stage2\nfrom dslaunch import zero, initialize"
                                     "\nimport dslaunch\ndslaunch.pipe.x\ndslaunch.__version__",
                                     "dslaunch.engine.zero", is_package=True)}
    assert got == {"dslaunch.engine.zero.stage2", "dslaunch.zero", "dslaunch.initialize",
                   "dslaunch", "dslaunch.pipe"}


@pytest.mark.parametrize("importer, source, expected", [
    ("dslaunch.launcher.fake", "import torch", {("torch", "launcher")}),
    ("dslaunch.launcher.fake", "def f():\n    import torch.distributed", {("torch.distributed",
                                                                          "launcher")}),
    ("dslaunch.launcher.fake", "from ..engine import comm", {("dslaunch.engine.comm",
                                                               "launcher")}),
    ("dslaunch.launcher.fake", "import importlib\nimportlib.import_module('dslaunch.kernels')",
     {("dslaunch.kernels", "launcher")}),
    ("dslaunch.launcher.fake", "from . import plan\nfrom dslaunch.config import errors\n"
                               "import dslaunch\nprint(dslaunch.__version__)", set()),
    ("dslaunch.engine.fake", "def f():\n    from dslaunch.zero import x", {("dslaunch.zero",
                                                                           "engine")}),
    ("dslaunch.engine.fake", "from dslaunch import initialize", {("dslaunch.initialize",
                                                                  "engine")}),
    ("dslaunch.engine.fake", "import dslaunch\ndef f():\n    return dslaunch.zero",
     {("dslaunch.zero", "engine")}),
    ("dslaunch.engine.fake", "from ..launcher import plan", {("dslaunch.launcher.plan",
                                                              "engine")}),
    ("dslaunch.engine.fake", "import torch\nfrom dslaunch.kernels import builder\n"
                             "from dslaunch.config import errors\nimport dslaunch", set()),
    ("dslaunch.config.fake", "def f():\n    import torch", {("torch", "config")}),
    ("dslaunch.config.fake", "from ..engine import comm", {("dslaunch.engine.comm", "config")}),
    ("dslaunch.config.fake", "from .errors import ConfigError", set()),
    ("dslaunch.kernels.fake", "def f():\n    from dslaunch.engine import comm",
     {("dslaunch.engine.comm", "kernels")}),
    ("dslaunch.kernels.fake", "import torch\nfrom . import builder", set()),
    ("dslaunch.cli.fake", "import torch", {("torch", "cli")}),
    ("dslaunch.cli.fake", "def f():\n    import torch\n    import dslaunch.engine.comm", set()),
    ("dslaunch.engine.fake", "import importlib\ndef f(n):\n    importlib.import_module(n)",
     {("<dynamic: n>", "engine")}),
])
def test_the_checker_fails_on_a_forbidden_import(importer, source, expected):
    """A fake module with one forbidden import (or none) gets exactly that violation."""
    got = {(v.imp.imported, v.rule) for v in check(_fake(source, importer))}
    assert got == expected


def test_start_up_follows_module_level_imports():
    """launcher -> config (module level) -> torch is caught; the same import inside a function
    is not followed."""
    mods = {"dslaunch", "dslaunch.launcher", "dslaunch.launcher.fake", "dslaunch.config",
            "dslaunch.config.fake"}
    imports = (_fake("from dslaunch.config import fake", "dslaunch.launcher.fake")
               + _fake("import numpy\nimport torch", "dslaunch.config.fake"))
    got = {(v.imp.importer, v.imp.imported) for v in check_startup(imports, mods)}
    assert got == {("dslaunch.launcher.fake", "torch"), ("dslaunch.config.fake", "torch")}
    lazy = (_fake("from dslaunch.config import fake", "dslaunch.launcher.fake")
            + _fake("def f():\n    import torch", "dslaunch.config.fake"))
    assert check_startup(lazy, mods) == []


# -- the engine's layers ---------------------------------------------------------------------------
# Inside dslaunch/engine/ every module belongs to one unit: the package (or top-level module) right
# under dslaunch.engine. Each unit sits on one layer, bottom first; a module imports, at any level
# (function-local imports count: a local import that dodges a cycle is still the cycle), only
# modules of its own unit or of a unit on a lower layer. Two units on one layer know nothing of
# each other. docs/architecture.md ("The engine's layers") draws the same map.
ENGINE_LAYERS = (
    # leaves: logging, precision and loss scale, the step policy, partition arithmetic, the fault
    # injector; monitors, FLOPs, profiling, the comms logger
    ("base", "observe"),
    # process groups, every collective and its accounting, who this process is in the job
    # (a standby, a replacement: membership.py)
    ("comm",),
    # optimizers (the 1-bit ones too) and schedules; the grid and every parallel axis
    # (topology, groups, tensor/AutoTP, pipeline modules, sequence, experts / MoE)
    ("optim", "parallel"),
    # checkpoint files (written and read by the layers above); data efficiency, compression,
    # sparse attention, random-LTD, curriculum, PLD, eigenvalue, activation checkpointing
    ("storage", "features"),
    # ZeRO strategies 0-3 with offload, NVMe, ZeRO++, zero.Init
    ("zero",),
    # save / load, consolidation, reshaping, universal and DeepSpeed formats
    ("checkpoint",),
    # the engines, DeepSpeed's engine surface, the engine's config, the recovery seams
    ("core",),
    # in-process recovery: built by initialize and handed to the engine (core/recovery_seams.py)
    ("recovery",),
    # initialize, add_config_arguments (and the package's own __init__)
    ("api", ""),
)
ENGINE = "dslaunch.engine"


def engine_unit(module: str) -> str:
    """The unit of an engine module: ``dslaunch.engine.zero.stage3`` -> ``zero``; the package
    itself -> ``""``."""
    return module[len(ENGINE) + 1:].split(".")[0] if module != ENGINE else ""


def layer_of(unit: str) -> int | None:
    return next((i for i, units in enumerate(ENGINE_LAYERS) if unit in units), None)


def engine_edges(imports: list) -> list:
    """The imports of one engine module by another (both under dslaunch.engine, not itself)."""
    return [i for i in imports if _under(i.importer, ENGINE) and _under(i.imported, ENGINE)
            and i.importer != i.imported]


def layer_violations(imports: list) -> list:
    """Each engine import that goes sideways (another unit of its layer) or up a layer."""
    bad = []
    for imp in engine_edges(imports):
        a, b = engine_unit(imp.importer), engine_unit(imp.imported)
        if a != b and layer_of(b) is not None and layer_of(a) is not None \
                and layer_of(b) >= layer_of(a):
            bad.append(f"{imp}  [{a} (layer {layer_of(a)}) may not import {b} "
                       f"(layer {layer_of(b)})]")
    return bad


def import_cycles(imports: list, modules: set) -> list:
    """The strongly connected components of more than one module in the graph of imports between
    ``modules`` (Tarjan's algorithm, iterative), each sorted."""
    graph: dict = {m: set() for m in modules}
    for imp in imports:
        if imp.importer in graph and imp.imported in graph and imp.importer != imp.imported:
            graph[imp.importer].add(imp.imported)
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def private_imports(source: str, importer: str, *, is_package: bool = False, file: str = "?",
                    known: set = frozenset()) -> list:
    """``from M import _name`` in ``source`` where M is another dslaunch module and ``_name`` is
    not a module of it: a private name taken across files (a helper two modules share belongs
    in a lower module, public)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = (_resolve_relative(importer, is_package, node.level, node.module)
                if node.level else node.module)
        if not base or not _under(base, "dslaunch") or base == importer:
            continue
        for a in node.names:
            if a.name.startswith("_") and not a.name.startswith("__") and \
                    f"{base}.{a.name}" not in known:
                out.append(f"{file}:{node.lineno}: {importer} imports {base}.{a.name}")
    return out


def engine_private_imports() -> list:
    mods = all_modules()
    return [line for name, path in mods.items() if _under(name, ENGINE)
            for line in private_imports(path.read_text(), name,
                                        is_package=path.name == "__init__.py",
                                        file=str(path.relative_to(ROOT)), known=set(mods))]


def test_every_engine_module_has_a_layer():
    units = {engine_unit(m) for m in all_modules() if _under(m, ENGINE)}
    missing = sorted(u for u in units if layer_of(u) is None)
    assert not missing, f"engine units on no layer of ENGINE_LAYERS: {missing}"
    listed = {u for units_ in ENGINE_LAYERS for u in units_}
    assert not listed - units, f"ENGINE_LAYERS names units that do not exist: {listed - units}"


def test_engine_imports_go_down_the_layers():
    bad = layer_violations(read_all())
    assert not bad, "engine layers (tests/test_import_rules.py, ENGINE_LAYERS):\n" + "\n".join(bad)


def test_no_import_cycle_among_engine_modules():
    imports = read_all()
    engine = {m for m in all_modules() if _under(m, ENGINE)}
    cycles = import_cycles(engine_edges(imports), engine)
    lines = []
    for comp in cycles:
        members = set(comp)
        lines.append(f"cycle of {len(comp)} modules: {', '.join(comp)}")
        lines += [f"    {i}" for i in engine_edges(imports)
                  if i.importer in members and i.imported in members]
    assert not cycles, "import cycles among engine modules:\n" + "\n".join(lines)


def test_no_engine_module_imports_a_private_name():
    bad = engine_private_imports()
    assert not bad, "private names imported across engine modules:\n" + "\n".join(bad)


def test_the_layer_checks_fail_on_a_bad_graph():
    """Not vacuous: an upward import, a sideways one, a cycle hidden in a function and a private
    name are each found on a fake engine."""
    known = {"dslaunch.engine.base.log", "dslaunch.engine.zero.stage3", "dslaunch.engine.core.engine",
             "dslaunch.engine.zero.base", "dslaunch.engine.optim.adam", "dslaunch.engine.parallel.tp"}

    def fake(source, importer):
        return imports_of(source, importer, file=f"{importer}.py", known=known)

    up = fake("from dslaunch.engine.core import engine", "dslaunch.engine.zero.stage3")
    side = fake("def f():\n    from dslaunch.engine.parallel import tp", "dslaunch.engine.optim.adam")
    down = fake("from dslaunch.engine.base import log", "dslaunch.engine.zero.stage3")
    for imp in up + side + down:
        assert imp.imported in known
    assert len(layer_violations(up)) == 1 and len(layer_violations(side)) == 1
    assert layer_violations(down) == []
    loop = (fake("from dslaunch.engine.zero import base", "dslaunch.engine.zero.stage3")
            + fake("def f():\n    from dslaunch.engine.zero import stage3", "dslaunch.engine.zero.base"))
    assert import_cycles(loop, known) == [["dslaunch.engine.zero.base", "dslaunch.engine.zero.stage3"]]
    assert import_cycles(loop[:1], known) == []
    got = private_imports("from .base import _helper, public\nfrom . import base",
                          "dslaunch.engine.zero.stage3", known=known)
    assert got == ["?:1: dslaunch.engine.zero.stage3 imports dslaunch.engine.zero.base._helper"]


def test_engine_layers_hold_on_the_real_tree():
    """The map covers the real engine: every layer has modules, and the scan sees imports between
    layers (it would pass vacuously on an empty graph)."""
    mods = [m for m in all_modules() if _under(m, ENGINE)]
    per_layer = [sum(engine_unit(m) in units for m in mods) for units in ENGINE_LAYERS]
    assert all(per_layer), dict(zip(ENGINE_LAYERS, per_layer))
    edges = engine_edges(read_all())
    assert len(edges) > 300
    assert any(engine_unit(i.importer) == "core" and engine_unit(i.imported) == "zero" for i in edges)
