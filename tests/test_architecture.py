"""The import graph of ``ampcert`` runs one way: no circles, nothing against the layer order.

The graph is read from the source with :mod:`ast` (nothing is imported), over
every import statement: module level, inside functions and under
``if TYPE_CHECKING:`` alike, because a lazy import is still a dependency.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
else to ``pkg``. docs/architecture.md explains the layers; keep the two in step.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import ampcert

PACKAGE_DIR = Path(ampcert.__file__).parent

# Top to bottom. A module may import from its own layer and the layers below;
# the first matching prefix decides a module's layer. ``ampcert`` itself (the
# package's public face, which re-exports the session API lazily) is the top.
LAYERS: list[tuple[str, ...]] = [
    ("ampcert", "ampcert.__main__", "ampcert.cli"),      # parse, call one function, print
    ("ampcert.session",),                                # the sequences a command runs
    ("ampcert.runner", "ampcert.own_job.run", "ampcert.own_job.keeper",  # execute a plan (an own job's too);
     "ampcert.gate", "ampcert.history"),                 # compare results; the nightly history
    ("ampcert.report",),                                 # report.json/html, signing
    ("ampcert.backends", "ampcert.certify", "ampcert.capacity_planning", "ampcert.memory",  # train one run; verdicts; capacity;
     "ampcert.track", "ampcert.integrations",             # what a team's own job writes (MLLOG, callbacks);
     "ampcert.own_job.result",                            # an own job's log read into its result;
     "ampcert.published"),                                # published MLPerf results, scored
    ("ampcert.aggregate", "ampcert.probe_summary"),      # one aggregation per group, for every view; the speed probe's
    ("ampcert.results",),                                # RunResult, the results folder
    ("ampcert.spec", "ampcert.stored_plan", "ampcert.own_job"),  # suites, the run matrix, own jobs' entries; plan.json
    ("ampcert.workloads", "ampcert.telemetry"),          # what is trained; what is measured
    ("ampcert.configio", "ampcert.atomic", "ampcert.resources", "ampcert.errors", "ampcert.mllog",
     "ampcert.envinfo", "ampcert.frameworks",
     "ampcert.console", "ampcert.version", "ampcert.vocabulary", "ampcert.formats",
     "ampcert.steady_state", "ampcert.regular_files"),  # leaves every layer may use
    ("ampcert.amp",),                                    # the AMP engine: usable alone
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The ``known`` modules that the statements in ``tree`` import."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in known:  # `import a.b.c` where only a.b is ours
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(module)
    return found


def import_graph(root: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    return {m: imported_modules(ast.parse(p.read_text(encoding="utf-8"), str(p)), m, p.name == "__init__.py", known)
            for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path that returns to its start), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def layer_of(module: str, layers: list[tuple[str, ...]] = LAYERS) -> int:
    best, index = -1, None
    for i, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    if index is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and to docs/architecture.md")
    return index


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Every import from a lower layer into a higher one (index grows downwards)."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if layer_of(m, layers) > layer_of(d, layers))


def third_party_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


# --------------------------------------------------------------------------- the code


GRAPH = import_graph()


def test_the_graph_is_read_from_the_whole_package():
    assert len(GRAPH) > 60 and "ampcert.cli" in GRAPH and "ampcert.amp.jax.autocast" in GRAPH
    assert "ampcert.results" in GRAPH["ampcert.certify.checks"]  # a module-level import is seen
    assert "ampcert.spec" in GRAPH["ampcert.results"]


def test_no_import_circle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_import_against_the_layer_order():
    assert upward_imports(GRAPH) == []


def test_every_module_has_a_layer():
    for m in GRAPH:
        layer_of(m)


def test_amp_imports_nothing_of_the_harness_and_amp_jax_no_torch():
    for m, deps in GRAPH.items():
        if m.startswith("ampcert.amp"):
            assert all(d.startswith("ampcert.amp") for d in deps), (m, sorted(deps))
    for path in (PACKAGE_DIR / "amp" / "jax").rglob("*.py"):
        assert "torch" not in third_party_imports(path), path


def test_the_cli_reaches_the_library_through_the_session():
    # cli.py parses and prints: it calls the session API (and the console), nothing that does the work.
    allowed = {"ampcert.session", "ampcert.console", "ampcert.errors", "ampcert.version", "ampcert.cli"}
    assert {d for d in GRAPH["ampcert.cli"] if d.split(".")[0:2] != ["ampcert", "cli"]} <= allowed, \
        sorted(GRAPH["ampcert.cli"])


def calls_in(tree: ast.AST) -> dict[str, set[str]]:
    """Per function (``Class.method`` or ``function``), the names it calls: ``f(...)`` as ``f``,
    ``x.f(...)`` as ``.f``. Nested functions count as their own."""
    out: dict[str, set[str]] = {}

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{owner}.{child.name}" if owner else child.name
                out[name] = {(f".{c.func.attr}" if isinstance(c.func, ast.Attribute) else c.func.id)
                             for c in ast.walk(child) if isinstance(c, ast.Call)
                             and isinstance(c.func, (ast.Attribute, ast.Name))}
                visit(child, owner)
            else:
                visit(child, owner)

    visit(tree, "")
    return out


def driver_loops(root: Path = PACKAGE_DIR) -> list[str]:
    """Every function that both submits runs to an executor and polls it: a driver loop."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for function, called in calls_in(ast.parse(path.read_text(encoding="utf-8"))).items():
            if {".submit", ".poll"} <= called:
                found.append(f"{module_name(path, root)}.{function}")
    return found


def starters_of_runs(root: Path = PACKAGE_DIR) -> list[str]:
    """Modules that start a run's process on this machine (a worker or torchrun's ranks)."""
    names = {"local_run", "WorkerRun", "TorchrunRun"}
    return sorted({module_name(p, root) for p in root.rglob("*.py")
                   for called in calls_in(ast.parse(p.read_text(encoding="utf-8"))).values() if called & names})


def test_one_driver_loop_for_every_executor():
    # run_fleet alone plans, starts, retries and stores runs; the local executor alone starts
    # processes on this machine, and only the driver (through it) reaches them.
    assert driver_loops() == ["ampcert.runner.fleet.run_fleet"]
    assert starters_of_runs() == ["ampcert.runner.local_executor"]
    users = sorted(m for m, deps in GRAPH.items() if "ampcert.runner.local_executor" in deps)
    assert users == ["ampcert.runner.executors", "ampcert.runner.fleet"], users


def test_the_session_is_a_package_of_one_concept_per_module():
    import ampcert.session as session

    modules = {m for m in GRAPH if m.startswith("ampcert.session.")}
    assert modules == {f"ampcert.session.{m}" for m in
                       ("folders", "runs", "signing", "compare", "history", "audits", "catalog", "published")}, modules
    assert all(hasattr(session, name) for name in session.__all__)
    # The CLI calls the session's public names only.
    used = {node.attr for path in (PACKAGE_DIR / "cli").glob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "session"}
    assert used <= set(session.__all__), sorted(used - set(session.__all__))


# Words that name a feature of the training loop (its plug-ins, ampcert/backends/features/),
# which neither the loop nor a framework's adapter may use: they reach a run only through
# the Feature protocol and the registry.
FEATURE_WORDS = frozenset({
    "fp8", "FP8_PRECISIONS", "torch_fp8", "Fp8Stats", "is_memory_sweep", "device_memory_limit", "sweep_batch",
    "injected_slowdown", "hold_step", "torch_compile", "CompiledStep", "launcher", "torchrun", "distributed",
    "dctx", "world_size", "torch_precision", "jax_precision", "PrecisionProbe", "lowest_precision",
    # RunSpec's groups that features read: how it launches, its sweep point, what is injected.
    "launch", "sweep", "fault",
})
# The loop and its protocols, and each framework's adapter: its entry point and its Framework
# class. (The Tally names the result's fields, some of which features fill.)
LOOP_AND_ADAPTERS = {"ampcert/backends/training_loop.py": ("train", "_train", "Clock", "Framework", "Feature"),
                     "ampcert/backends/torch_backend.py": ("train", "TorchFramework"),
                     "ampcert/backends/jax_backend.py": ("train", "JaxFramework")}


def feature_words_in(source: str, only: tuple[str, ...] | None = None) -> set[str]:
    """The feature words among the identifiers (names, attributes, imports, definitions) of
    ``source``, or of its top-level definitions named in ``only``."""
    tree = ast.parse(source)
    roots = [node for node in tree.body if only is None or getattr(node, "name", None) in only]
    if only is not None:
        assert sorted(getattr(node, "name", "") for node in roots) == sorted(only), only
    words: set[str] = set()
    for root in roots:
        for node in ast.walk(root):
            if isinstance(node, ast.Name):
                words.add(node.id)
            elif isinstance(node, ast.Attribute):
                words.add(node.attr)
            elif isinstance(node, ast.alias):
                words.update(node.name.split(".") + [node.asname or ""])
            elif isinstance(node, ast.ImportFrom):
                words.update((node.module or "").split("."))
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.arg)):
                words.add(node.name if not isinstance(node, ast.arg) else node.arg)
    return words & FEATURE_WORDS


def test_the_loop_and_the_adapters_name_no_feature():
    """One loop for every framework; each feature a plug-in behind the Feature protocol."""
    root = PACKAGE_DIR.parent
    for path, only in LOOP_AND_ADAPTERS.items():
        assert feature_words_in((root / path).read_text(encoding="utf-8"), only) == set(), path
    # Every registered feature is a Feature, in a module of its own under backends/features/.
    from ampcert.backends import features
    from ampcert.backends.training_loop import Feature

    made = [entry.make() for entry in features.REGISTRY]
    assert all(isinstance(f, Feature) for f in made)
    assert {type(f).__module__.rsplit(".", 1)[0] for f in made} == {"ampcert.backends.features"}
    # The training loop is only in training_loop.py: no other module logs a block of steps.
    blocks = sorted(str(p.relative_to(root)) for p in PACKAGE_DIR.rglob("*.py")
                    if "mllog.BLOCK_START" in p.read_text(encoding="utf-8"))
    assert blocks == ["ampcert/backends/training_loop.py"], blocks


# --------------------------------------------------------------------------- the checks can fail


def test_a_loop_that_names_a_feature_is_found():
    inline = ("def step(self, spec):\n    if spec.precision in FP8_PRECISIONS:\n        self.fp8.before_step(1)\n"
              "    if spec.injected_slowdown:\n        hold_step(0.1, 0)\n")
    assert feature_words_in(inline) == {"FP8_PRECISIONS", "fp8", "injected_slowdown", "hold_step"}
    assert feature_words_in("from ampcert.backends import distributed\nclass TorchFramework:\n    pass\n",
                            ("TorchFramework",)) == set()
    assert feature_words_in("import ampcert.backends.torch_fp8 as f\n") == {"torch_fp8"}


def test_a_second_driver_loop_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "runner/fleet.py": "def run_fleet(executor):\n    executor.submit([])\n    executor.poll(1)\n",
        "session.py": ("class Local:\n    def drive(self, executor):\n        t = executor.submit([])\n"
                       "        while t:\n            t = executor.poll(0.5)\n"),
        "other.py": "def start(spec):\n    return local_run(spec)\n",
    })
    assert driver_loops(root) == ["pkg.runner.fleet.run_fleet", "pkg.session.Local.drive"]
    assert starters_of_runs(root) == ["pkg.other"]


SYNTHETIC_LAYERS = [("pkg.cli",), ("pkg.runner",), ("pkg.spec",)]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_synthetic_circle_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "cli.py": "from pkg import runner\n",
        "runner/__init__.py": "",
        "runner/plan.py": "def f():\n    from pkg.spec import load  # a lazy import is an edge too\n",
        "spec.py": "from .runner import plan\n",  # relative, back up: spec -> runner.plan -> spec
    })
    graph = import_graph(root)
    assert graph["pkg.cli"] == {"pkg.runner"}
    assert graph["pkg.spec"] == {"pkg.runner.plan"} and graph["pkg.runner.plan"] == {"pkg.spec"}
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"pkg.spec", "pkg.runner.plan"}
    assert upward_imports(graph, SYNTHETIC_LAYERS) == ["pkg.spec -> pkg.runner.plan"]


def test_type_checking_imports_count_and_a_clean_graph_passes(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "cli.py": "import pkg.runner.plan\n",
        "runner/__init__.py": "",
        "runner/plan.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import spec\n",
        "spec.py": "import os\n",
    })
    graph = import_graph(root)
    assert graph["pkg.runner.plan"] == {"pkg.spec"}
    assert find_cycle(graph) is None and upward_imports(graph, SYNTHETIC_LAYERS) == []
    (root / "spec.py").write_text("if False:\n    import pkg.cli\n")  # never runs, still a dependency
    assert set(find_cycle(import_graph(root)) or []) == {"pkg.cli", "pkg.runner.plan", "pkg.spec"}
    assert upward_imports(import_graph(root), SYNTHETIC_LAYERS) == ["pkg.spec -> pkg.cli"]
