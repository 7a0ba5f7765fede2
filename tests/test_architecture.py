"""The tree's rules (docs/architecture.md, "Layers and rules"), checked by reading the imports.

Static, with ``ast``: nothing is imported, so a lazy import inside a function counts as
much as one at the top of a module.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from pathlib import Path

import pytest

from support.env import REPO_ROOT

PACKAGE = REPO_ROOT / "prime_runs_spool"

#: The layers, lowest first: each may import itself and the layers before it, never one
#: after it. The same order is stated in docs/architecture.md.
LAYERS = ["errors", "spool", "store", "content", "platform_api", "sync", "runner", "importer", "export", "viewer", "local_platform"]

#: Modules that belong to the lowest layer with errors.py: they import nothing of ours but it.
BASE_MODULES = {"prime_runs_spool.errors": "errors", "prime_runs_spool._version": "errors",
                "prime_runs_spool.files": "errors", "prime_runs_spool.plural": "errors",
                "prime_runs_spool.signal_event": "errors"}

#: What runner/ may import from sync/: only the state file's model, never the engine.
RUNNER_MAY_IMPORT_FROM_SYNC = {"prime_runs_spool.sync.state"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (absolute names; ``from X import Y`` yields X and X.Y)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; this package imports absolutely"
            names.append(node.module or "")
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _layer(module: str) -> str | None:
    """The layer of one of our modules; None for the package's facade (``__init__``)."""
    if module in BASE_MODULES:
        return BASE_MODULES[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _ours(name: str) -> str | None:
    """The module of ours that an imported name refers to (longest match), if any."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def test_every_module_is_in_a_layer() -> None:
    """A new folder or root module must be placed in LAYERS (and the docs) on purpose."""
    stray = [m for m in MODULES if m != "prime_runs_spool" and _layer(m) is None]
    assert stray == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_layer_imports_only_layers_below_it(module: str) -> None:
    layer = _layer(module)
    if layer is None:
        return  # the package facade re-exports the public API of several layers
    rank = LAYERS.index(layer)
    above = []
    for name in _imports(MODULES[module]):
        target = _ours(name)
        if target is None or target == "prime_runs_spool":
            continue
        if LAYERS.index(_layer(target) or "errors") > rank:
            above.append(target)
    assert above == [], f"{module} ({layer}) imports from a higher layer"


def test_runner_reads_only_the_sync_state() -> None:
    for module, path in MODULES.items():
        if _layer(module) != "runner":
            continue
        reached = {_ours(name) for name in _imports(path)} - {None}
        from_sync = {m for m in reached if _layer(m) == "sync"}
        assert from_sync <= RUNNER_MAY_IMPORT_FROM_SYNC, module


def _constants(path: Path) -> list[tuple[object, int]]:
    """Literal values in ``path`` with their lines, leaving out docstrings and ``__slots__``."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            skip.update(id(n) for n in ast.walk(node.value))
    return [(n.value, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in skip]


@pytest.mark.slow
def test_nothing_in_the_library_imports_or_launches_commands() -> None:
    offenders = []
    for module, path in MODULES.items():
        if any(name == "commands" or name.startswith("commands.") for name in _imports(path)):
            offenders.append(f"{module} imports commands")
        for value, line in _constants(path):
            if isinstance(value, str) and (value == "commands" or value.startswith("commands.")):
                offenders.append(f"{module}:{line} names the commands package")
    assert offenders == []


#: Each fact, and the one module allowed to spell it out.
FACTS = {
    26_214_400: "prime_runs_spool.platform_api.v0",  # the platform's 25 MiB request limit
    "header": "prime_runs_spool.spool.format",
    "manifest": "prime_runs_spool.spool.format",
    "episode": "prime_runs_spool.spool.format",
    "seal": "prime_runs_spool.spool.format",
    # a run's statuses: those a seal records and those derived from its segments
    "completed": "prime_runs_spool.spool.format",
    "failed": "prime_runs_spool.spool.format",
    "cancelled": "prime_runs_spool.spool.format",
    "crashed": "prime_runs_spool.spool.format",
    "live": "prime_runs_spool.spool.format",
    "torn": "prime_runs_spool.spool.format",
    "corrupt": "prime_runs_spool.spool.format",
    # what a sync says of a run, and an import of an eval's outputs (beside sync's words)
    "up_to_date": "prime_runs_spool.sync.options",
    "synced": "prime_runs_spool.sync.options",
    "skipped": "prime_runs_spool.sync.options",
    "imported": "prime_runs_spool.importer.outputs",
    "appended": "prime_runs_spool.importer.outputs",
    "spooled": "prime_runs_spool.importer.outputs",
    # the spool's own files
    "spool": "prime_runs_spool.spool.layout",
    "run.lock": "prime_runs_spool.spool.layout",
    ".lock": "prime_runs_spool.spool.layout",
    ".durable": "prime_runs_spool.spool.layout",
    # sync's: its state folder, its lock, its lease in an object store, its copy locks
    "sync": "prime_runs_spool.sync.state",
    "sync.lock": "prime_runs_spool.sync.many",
    "sync.lease.json": "prime_runs_spool.sync.leased",
    "copies": "prime_runs_spool.sync.copies",
    # the mirror's note in a run folder it copies
    "mirror.json": "prime_runs_spool.store.mirror",
    # the online shipper's log
    "shipper.log": "prime_runs_spool.runner.online",
    # what verifiers writes, and the import's own files
    "traces.jsonl": "prime_runs_spool.content.supersede",
    "metadata.json": "prime_runs_spool.importer.paths",
    "results.jsonl": "prime_runs_spool.importer.paths",
    "import.json": "prime_runs_spool.importer.paths",
    "import.lock": "prime_runs_spool.importer.paths",
    "traces-agreed.json": "prime_runs_spool.importer.paths",
    # the local platform's database beside its WAL files
    "-wal": "prime_runs_spool.local_platform.store",
    # the viewer's search indexes in the user's cache
    "viewer-search": "prime_runs_spool.viewer.search",
}

#: Modules where one of FACTS' strings means something else: the click command's own name
#: (``sync``, not a file name); a segment's JSON field (``live``, whether its writer runs).
OTHER_MEANINGS = {"sync": {"commands.sync", "commands.cli"}, "live": {"commands.verify"}}


@pytest.mark.slow
def test_each_fact_is_spelled_out_in_exactly_one_module() -> None:
    homes: dict[object, Counter[str]] = {fact: Counter() for fact in FACTS}
    sources = {**MODULES, **{f"commands.{p.stem}": p for p in (REPO_ROOT / "commands").glob("*.py")}}
    for module, path in sources.items():
        for value, _ in _constants(path):
            if type(value) in (int, str) and value in homes and not isinstance(value, bool):
                homes[value][module] += 1
    wrong = {fact: dict(found) for fact, found in homes.items()
             if set(found) - OTHER_MEANINGS.get(fact, set()) != {FACTS[fact]}}
    assert wrong == {}


#: The one module that spells out file modes (``FILE_MODE``, ``DIR_MODE``) and says how
#: files are made private; everything else names its constants and calls its helpers.
MODES_HOME = "prime_runs_spool.files"
#: Calls that give a file or a folder its mode: the argument's position (from 0) for a
#: call on ``os``, and on anything else (a ``Path``), and the constants it may be.
MODE_CALLS = {"open": (2, None, {"FILE_MODE"}), "chmod": (1, 0, {"FILE_MODE", "DIR_MODE"}),
              "fchmod": (1, None, {"FILE_MODE", "DIR_MODE"}), "lchmod": (1, 0, {"FILE_MODE", "DIR_MODE"}),
              "mkdir": (1, 0, {"DIR_MODE"}), "makedirs": (1, None, {"DIR_MODE"})}


def _mode_offenders(source: str, module: str) -> list[str]:
    """Where ``source`` spells a file mode itself: an octal literal (``0o600``), or a call
    that creates a file or folder, or changes its mode, with a mode that is not the
    owner's constant (or none where the default would be the umask's, ``0o777`` less it)."""
    offenders = [f"{module}:{token.start[0]} spells a mode: {token.string}"
                 for token in tokenize.generate_tokens(io.StringIO(source).readline)
                 if token.type == tokenize.NUMBER and token.string[:2].lower() == "0o"]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _creates_with_the_umask(node):
            offenders.append(f"{module}:{node.lineno} {ast.unparse(node.func)} creates a file with the umask's mode")
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MODE_CALLS):
            continue
        on_os = isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
        os_position, other_position, allowed = MODE_CALLS[node.func.attr]
        position = os_position if on_os else other_position
        if position is None:
            continue  # not the call meant (a file object's ``open``, say)
        [mode] = [k.value for k in node.keywords if k.arg == "mode"] or node.args[position:position + 1] or [None]
        if mode is None and node.func.attr == "open" and "O_CREAT" not in ast.unparse(node.args[1]):
            continue  # opens a file that is there: no mode given, none needed
        named = mode.id if isinstance(mode, ast.Name) else mode.attr if isinstance(mode, ast.Attribute) else None
        if named not in allowed:
            given = ast.unparse(mode) if mode is not None else "no mode"
            offenders.append(f"{module}:{node.lineno} {ast.unparse(node.func)} with {given}, not {' or '.join(sorted(allowed))}")
    return offenders


def _creates_with_the_umask(call: ast.Call) -> bool:
    """Python's ``open(path, "w")`` (or ``Path.open``, ``write_text``, ``write_bytes``,
    ``touch``): a new file gets ``0o666`` less the umask, readable by everyone."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("write_text", "write_bytes", "touch"):
        return True
    if isinstance(func, ast.Name) and func.id == "open":
        position = 1
    elif isinstance(func, ast.Attribute) and func.attr == "open" and not (
            isinstance(func.value, ast.Name) and func.value.id == "os"):
        position = 0
    else:
        return False
    [mode] = [k.value for k in call.keywords if k.arg == "mode"] or call.args[position:position + 1] or [None]
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(set(mode.value) & set("wax+"))


def test_file_modes_are_spelled_out_only_in_files_py() -> None:
    """Everything the package writes is ``0600`` in folders ``0700`` (docs/spool-format.md,
    section 1): one place says so, so that no module can drift from it on its own."""
    sources = {**MODULES, **{f"commands.{p.stem}": p for p in (REPO_ROOT / "commands").glob("*.py")}}
    offenders = [found for module, path in sources.items() if module != MODES_HOME
                 for found in _mode_offenders(path.read_text(), module)]
    assert offenders == []


def test_the_mode_check_finds_a_mode_of_its_own() -> None:
    spelled = _mode_offenders("import os\nfd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)\n", "m")
    assert len(spelled) == 2  # the literal, and a mode that is not FILE_MODE
    assert _mode_offenders("os.open(p, os.O_WRONLY | os.O_CREAT)\nPath(p).mkdir(parents=True)\n", "m") == [
        "m:1 os.open with no mode, not FILE_MODE", "m:2 Path(p).mkdir with no mode, not DIR_MODE"]
    assert _mode_offenders("os.open(p, os.O_RDONLY)\nos.chmod(p, files.FILE_MODE)\nf.open()\n"
                           "open(p, 'rb')\nos.fdopen(fd, 'wb')\n", "m") == []
    assert len(_mode_offenders("open(p, 'w')\nPath(p).open(mode='ab')\nPath(p).write_bytes(b'')\n", "m")) == 3


#: The one module that opens a folder to fsync it (``fsync_folder``): how a new name is made
#: durable is said once, with its flags (``O_CLOEXEC``: a child started meanwhile inherits
#: no folder descriptor).
FOLDER_FSYNC_HOME = "prime_runs_spool.files"


def _folder_openers(source: str, module: str) -> list[str]:
    """Where ``source`` opens a folder itself: any use of ``O_DIRECTORY``."""
    return sorted(f"{module}:{node.lineno} opens a folder itself ({ast.unparse(node)})"
            for node in ast.walk(ast.parse(source))
            if (isinstance(node, ast.Attribute) and node.attr == "O_DIRECTORY")
            or (isinstance(node, ast.Constant) and node.value == "O_DIRECTORY"))


def test_folders_are_fsynced_only_through_files_py() -> None:
    sources = {**MODULES, **{f"commands.{p.stem}": p for p in (REPO_ROOT / "commands").glob("*.py")}}
    offenders = [found for module, path in sources.items() if module != FOLDER_FSYNC_HOME
                 for found in _folder_openers(path.read_text(), module)]
    assert offenders == []
    assert _folder_openers("os.open(d, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))\nos.open(d, os.O_DIRECTORY)\n",
                           "m") == ["m:1 opens a folder itself ('O_DIRECTORY')", "m:2 opens a folder itself (os.O_DIRECTORY)"]


def test_every_name_in_the_error_tree_is_defined_once() -> None:
    """errors.py is the one home of every exception: a second class of the same name there
    silently replaces the first for everyone who imports it."""
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    names = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})



def _import_graph() -> dict[str, set[str]]:
    """Each of our modules, the command line's (``commands.*``) included, and the modules
    of ours it names in an import: at the top, in a function, under ``TYPE_CHECKING`` alike
    (a cycle through any of them is still a cycle of meaning, and the next lazy import made
    eager turns it into one at run time)."""
    graph = {module: {target for name in _imports(path) if (target := _ours(name)) not in (None, module)}
             for module, path in MODULES.items()}
    commands = {path.stem for path in (REPO_ROOT / "commands").glob("*.py")}
    for path in (REPO_ROOT / "commands").glob("*.py"):
        module = f"commands.{path.stem}"
        named = {f"commands.{name}" for name in _command_imports(path) & commands}
        graph[module] = (named | {t for name in _command_library_imports(path) if (t := _ours(name))}) - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            component = {stack.pop()}
            while module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_import_cycle_anywhere_in_the_package() -> None:
    """No module of the package or of the command line imports, however indirectly, a
    module that imports it back (type-checking and lazy imports included): each room
    reads, and tests, from its own imports down."""
    graph = _import_graph()
    assert any(module.startswith("commands.") for module in graph)  # the command line is in it
    assert [sorted(c) for c in _cycles(graph)] == []


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check above is not vacuous: a cycle through a lazy import is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]

#: What the pass (sync/engine.py) may know of sinks: the contract, the registry and the one
#: module that chooses. A branch on samples or Prime Traces would need one of the others.
PASS = "prime_runs_spool.sync.engine"
SINK_SPECIFIC = {"prime_runs_spool.sync.sinks.samples", "prime_runs_spool.sync.sinks.traces",
                 "prime_runs_spool.sync.sinks.addressed", "prime_runs_spool.sync.reconcile",
                 "prime_runs_spool.sync.options.SAMPLES", "prime_runs_spool.sync.options.TRACES"}


def test_the_pass_names_no_sink() -> None:
    """The pass drives any sink through one loop: it imports no sink of its own accord, nor
    the samples reconciler, nor a sink's name, and spells none out."""
    named = set(_imports(MODULES[PASS])) & SINK_SPECIFIC
    spelled = [value for value, _ in _constants(MODULES[PASS]) if value in ("samples", "traces")]
    assert (sorted(named), spelled) == ([], [])


def _command_imports(path: Path) -> set[str]:
    """The modules of the command line package (``commands``) that ``path`` imports, lazy
    imports and type-checking imports included; relative imports resolved."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = node.module
                found.update([base] if base else [alias.name for alias in node.names])
            elif node.module and node.module.split(".")[0] == "commands":
                found.add(node.module.split(".")[1] if "." in node.module else "")
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("commands."))
    return {name for name in found if name}


def _command_library_imports(path: Path) -> list[str]:
    """The absolute imports of a command line module (the library's modules among them)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def _exception_classes() -> list[tuple[str, str]]:
    """Every class of the package that is an exception: ``(module, name)``. Read statically:
    a class whose base is a built-in exception, or, transitively, one of these."""
    import builtins

    defined: list[tuple[str, str, list[str]]] = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, (ast.Name, ast.Attribute))]
                defined.append((module, node.name, bases))
    exceptions = {name for name in dir(builtins)
                  if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), BaseException)}
    grew = True
    while grew:
        grew = False
        for _, name, bases in defined:
            if name not in exceptions and any(base in exceptions for base in bases):
                exceptions.add(name)
                grew = True
    return [(module, name) for module, name, bases in defined if any(base in exceptions for base in bases)]


@pytest.mark.slow
def test_every_exception_class_is_in_errors_py_and_drawn_in_its_tree() -> None:
    """One exception tree: every exception class of the package is defined in errors.py and
    named in the tree its docstring draws, so a caller finds every kind in one place. The one
    exception is a private class that no other module names (a signal that never leaves its
    function), and the docstring names it too."""
    errors_module = "prime_runs_spool.errors"
    drawn = ast.get_docstring(ast.parse((PACKAGE / "errors.py").read_text())) or ""
    sources = {module: path.read_text() for module, path in MODULES.items()}
    found = _exception_classes()
    assert len(found) > 40, found  # the reading above sees the tree at all
    outside = []
    for module, name in found:
        if module == errors_module:
            continue
        named_elsewhere = [other for other, text in sources.items()
                           if other not in (module, errors_module) and re.search(rf"\b{re.escape(name)}\b", text)]
        if not name.startswith("_") or named_elsewhere:
            outside.append(f"{module}.{name}")
    assert outside == [], "define these in errors.py, under SpoolError"
    undrawn = [name for _, name in found if not re.search(rf"\b{re.escape(name)}\b", drawn)]
    assert undrawn == [], "draw these in errors.py's tree"


#: The most lines one module may hold: past it, a module has grown a second job.
MAX_MODULE_LINES = 600


def test_no_module_is_over_the_line_limit() -> None:
    """Small modules with one job: no .py file of the package or of commands/ is over
    MAX_MODULE_LINES lines; one that grows past it is split by job."""
    paths = [*PACKAGE.rglob("*.py"), *(REPO_ROOT / "commands").rglob("*.py")]
    assert len(paths) > 50, paths  # the walk above sees the tree at all
    over = {str(path.relative_to(REPO_ROOT)): count for path in paths
            if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert over == {}, f"split these by job (at most {MAX_MODULE_LINES} lines each)"


#: The one module that reads a ``MaskRules``' memo: others keep what they derive from the
#: rules through ``MaskRules.derived``, so the memo's layout can change in one place.
MASK_MEMO_HOME = "prime_runs_spool.content.masking"


def test_only_masking_reads_the_rules_memo() -> None:
    readers = sorted(module for module, path in MODULES.items() if module != MASK_MEMO_HOME
                     and any(isinstance(node, ast.Attribute) and node.attr == "_memo"
                             for node in ast.walk(ast.parse(path.read_text()))))
    assert readers == [], "keep what a module derives from MaskRules with MaskRules.derived"


def test_every_module_compiles_without_a_warning() -> None:
    """A string with an invalid escape (``\\w`` in a docstring that is not a raw string) is
    a warning at compile time, shown to whoever first imports the module from source (a
    SyntaxWarning from Python 3.12, an error in a later release): each module is compiled
    here with warnings as errors."""
    import warnings

    sources = {**MODULES, **{f"commands.{p.stem}": p for p in (REPO_ROOT / "commands").glob("*.py")}}
    problems = []
    for module, path in sources.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                compile(path.read_text(), str(path), "exec")
            except SyntaxError as exc:
                problems.append(f"{module}, line {exc.lineno}: {exc.msg}")
    assert problems == [], problems
