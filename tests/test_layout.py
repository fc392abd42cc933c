"""The shape of the code: layers without circles, every role built the same
way, thin entry points, and a schema layer free of the roles' code.

The import graph is read from the sources (every import, at the top of a
module, inside a function or under `if TYPE_CHECKING:`), so that a lazy or
type-only import counts as much as any other."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO

from rl.config import ROLES

LAYERS: list[tuple[str, list[str]]] = [
    ("foundations", ["rl", "rl.errors", "rl.fsio", "rl.schema", "rl.layout", "rl.curves"]),
    ("config sections: every */config.py but rl/config.py", ["*.config"]),
    ("components", ["rl.store", "sandboxes", "rl.model", "rl.tasks"]),
    ("engines, checks and the agent", ["rl.engine", "rl.verify", "rl.agent"]),
    ("the run context", ["rl.context"]),
    (
        "what every role may use: the generators' service and client, the OpenAI endpoint in front of them, "
        "the episode",
        ["rl.serving", "rl.gateway", "rl.episodes"],
    ),
    ("the roles, in submission order", [f"rl.{name}" for name in ROLES]),
    ("the run schema", ["rl.config", "rl.configdoc"]),
    ("the run machinery", ["rl.run"]),
    ("tools", ["rl.chaos", "rl.bench"]),
    ("entry points", ["jobs"]),
]
"""Lowest first. A module imports modules of lower layers, of its own
package, and of packages listed before its own in its layer: the OpenAI
endpoint (rl.gateway) uses the generators' client (rl.serving), the
episode (rl.episodes) plays through either. No role's package imports
another's (test_no_role_imports_another): what several roles use lives a
layer below them. Config sections
(`*/config.py`) form the schema layer: they import only the foundations,
other sections, and the model's and the losses' sections."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in [*REPO.glob("rl/**/*.py"), *REPO.glob("jobs/*.py"), *REPO.glob("sandboxes/*.py")]:
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        out[name] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module of ours that an imported name belongs to."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> set[str]:
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:  # `from pkg import module` depends on the module
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in MODULES else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            for attr in ("body", "orelse", "finalbody", "handlers"):
                sub = getattr(node, attr, None)
                if isinstance(sub, list):
                    visit(sub)

    visit(ast.parse(path.read_text()).body)
    return {o for o in map(_owner, found) if o is not None}


GRAPH: dict[str, set[str]] = {m: _imports(p) - {m} for m, p in MODULES.items()}


def _layer(module: str) -> tuple[int, int]:
    """(layer, position in it) of a module."""
    if module.endswith(".config") and module != "rl.config":
        return (1, -1)  # sections import each other freely: the circle check keeps them apart
    matches = [
        (len(prefix), i, j)
        for i, (_, prefixes) in enumerate(LAYERS)
        for j, prefix in enumerate(prefixes)
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} belongs to no layer: add it to LAYERS"
    _, i, j = max(matches)  # the longest prefix: `rl.config` is not `rl`
    return (i, j)


def _package(module: str) -> str:
    """`rl.rollout` for `rl.rollout.worker`; `sandboxes` and `jobs` are one package each."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "rl" and len(parts) > 1 else parts[0]


def test_there_is_no_import_circle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for m in sorted(GRAPH):
        if m not in index:
            strong(m)
    assert circles == []


def test_no_module_imports_a_higher_layer() -> None:
    upward = []
    for a, targets in sorted(GRAPH.items()):
        la = _layer(a)
        for b in sorted(targets):
            lb = _layer(b)
            if _package(a) == _package(b) or lb[0] < la[0]:
                continue
            if la[0] == lb[0] and (lb[1] < la[1] or la[0] == 1):
                continue  # a package uses one listed before it in its layer (a role, one submitted before it)
            if la[0] == 1 and (b == "rl.model" or b.startswith("rl.learner.losses")):
                continue  # a config section takes the model's and the losses' sections
            upward.append(f"{a} -> {b}")
    assert upward == []


def test_no_role_imports_another() -> None:
    """What two roles share lives below them (rl.serving, rl.episodes), so
    that a role can change without reading the others; their config
    sections may still read each other (values are resolved in rl.config)."""
    roles = {f"rl.{name}" for name in ROLES}
    across = [
        f"{a} -> {b}"
        for a, targets in sorted(GRAPH.items())
        for b in sorted(targets)
        if _package(a) in roles
        and _package(b) in roles
        and _package(a) != _package(b)
        and not (a.endswith(".config") and b.endswith(".config"))
    ]
    assert across == []


def test_config_sections_are_pydantic_only() -> None:
    """The login node validates a config without torch, vLLM or the roles' code."""
    allowed = {"rl.schema", "rl.model", "rl.errors", "rl.fsio"}
    for module in [m for m in MODULES if m.endswith(".config") and m != "rl.config"]:
        bad = {b for b in GRAPH[module] if b not in allowed and not b.endswith(".config")}
        bad = {b for b in bad if not b.startswith("rl.learner.losses")}  # the loss sections
        assert not bad, f"{module} imports {sorted(bad)}"


def test_the_run_schema_imports_only_the_roles_config_sections() -> None:
    roles = {f"rl.{name}" for name in ROLES}
    from_roles = {b for b in GRAPH["rl.config"] if _package(b) in roles}
    assert from_roles and all(b.endswith(".config") for b in from_roles), sorted(from_roles)


def test_no_roles_code_sees_the_whole_config_or_the_machinery() -> None:
    """Only the machinery that acts on every role (launch, recovery, status)
    sees the whole run config; a role reads its own section."""
    roles = {f"rl.{name}" for name in ROLES}
    for module in [m for m in MODULES if _package(m) in roles and not m.endswith(".config")]:
        bad = {b for b in GRAPH[module] if b == "rl.config" or b.startswith("rl.run")}
        assert not bad, f"{module} imports {sorted(bad)}"


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_role_is_a_package_with_a_loop_of_its_context_and_own_section(role: str) -> None:
    import importlib

    from rl.context import RunContext

    loop = importlib.import_module(f"rl.{role}.loop")
    sig = inspect.signature(loop.run, eval_str=True)
    assert list(sig.parameters) == ["ctx", "cfg"], sig
    assert sig.parameters["ctx"].annotation is RunContext
    assert sig.parameters["cfg"].annotation is ROLES[role].config
    lines = len(inspect.getsource(loop.run).splitlines())
    assert lines <= 60, f"rl.{role}.loop.run is {lines} lines: a loop reads as an outline"
    assert loop.__doc__ and len(loop.__doc__.strip().splitlines()) >= 2  # it says what it does


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_roles_entry_point_is_thin(role: str) -> None:
    module = ROLES[role].job_class.partition(":")[0]
    path = REPO / (module.replace(".", "/") + ".py")
    lines = len(path.read_text().splitlines())
    assert lines <= 50, f"{path.relative_to(REPO)} is {lines} lines"
    heavy = {b for b in GRAPH[module] if _package(b) == f"rl.{role}" and not b.endswith((".config", ".shares"))}
    assert heavy <= {f"rl.{role}.loop"}, f"{module} imports {sorted(heavy)} instead of handing over to the loop"


def test_the_store_imports_neither_the_config_nor_pydantic(tmp_path: Path) -> None:
    code = (
        "import sys; import rl.store, rl.store.weights, rl.store.rollouts, rl.store.inspect;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic' or m.startswith('rl.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout)  # a printed list of module names
    assert not [m for m in loaded if m.startswith("pydantic")], loaded
    assert set(loaded) <= {
        "rl.errors",
        "rl.fsio",
        "rl.layout",
        "rl.lifetime",
        "rl.store",
        "rl.store.weights",
        "rl.store.rollouts",
        "rl.store.cursor",
        "rl.store.inspect",
        "rl.store.given_up",
        "rl.store.zgroup",
    }, loaded


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The checks above would pass on an empty graph: they see a real one."""
    assert "rl.config" in GRAPH["rl.run.rundir"]  # the machinery reads the config
    assert "rl.rollout.worker" in GRAPH["rl.rollout.loop"]  # a lazy import counts
    assert "rl.run.role" not in GRAPH["rl.run.executors"]  # a TYPE_CHECKING import does not
    sizes = defaultdict(int)
    for m in GRAPH:
        sizes[_layer(m)[0]] += 1
    assert all(sizes[i] for i in range(len(LAYERS))), sizes  # every layer holds modules


RUN_DIR_NAMES = (  # rl.layout.SUBDIRS and its files
    "store.zarr",
    "checkpoints",
    "heartbeats",
    "submissions",
    "endpoints",
    "tb",
    "secret",
    "created_at",
)


def test_every_run_directory_path_is_built_by_the_layout() -> None:
    """A run directory's parts are named in rl/layout.py alone: a literal join
    elsewhere (`run / "tb"`) would go on working after the layout changed."""
    join = re.compile(r'/\s*"(' + "|".join(re.escape(n) for n in RUN_DIR_NAMES) + r')"')
    found = [
        f"{p.relative_to(REPO)}:{i}: {line.strip()}"
        for p in sorted([*(REPO / "rl").rglob("*.py"), *(REPO / "jobs").rglob("*.py")])
        if p != REPO / "rl" / "layout.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if join.search(line)
    ]
    assert not found, "\n".join(found)


def test_every_class_name_is_defined_once() -> None:
    """Two classes of one name (a `Call` of the tools and one of the endpoint)
    leave a reader to find out which one a module means."""
    where: dict[str, list[str]] = defaultdict(list)
    for root in ("rl", "jobs", "sandboxes"):
        for p in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ClassDef):
                    where[node.name].append(f"{p.relative_to(REPO)}:{node.lineno}")
    assert not {name: at for name, at in where.items() if len(at) > 1}


def test_no_test_file_is_over_800_lines() -> None:
    """A test file past 800 lines holds more than one component's tests."""
    long = {p.name: n for p in (REPO / "tests").glob("*.py") if (n := len(p.read_text().splitlines())) > 800}
    assert not long


LONG_FUNCTION, MOST_LONG_FUNCTIONS = 60, 10
LONG_MODULE, MOST_LONG_MODULES = 450, 3


def _sources() -> list[Path]:
    return sorted(p for root in ("rl", "jobs", "sandboxes") for p in (REPO / root).rglob("*.py"))


def test_at_most_ten_functions_are_over_sixty_lines() -> None:
    """A function past 60 lines mostly holds several steps that want names.
    The ones left are a loop or a request handler read best whole, and the
    trusted programs sent into a sandbox as one file (sandboxes/resident.py,
    rl/verify/runner.py, rl/verify/node_runner.py)."""
    long = sorted(
        (node.end_lineno - node.lineno + 1, f"{p.relative_to(REPO)}:{node.lineno} {node.name}")
        for p in _sources()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > LONG_FUNCTION
    )
    assert len(long) <= MOST_LONG_FUNCTIONS, "\n".join(f"{n} lines: {where}" for n, where in reversed(long))


def test_at_most_three_modules_are_over_450_lines() -> None:
    """A module past 450 lines mostly holds more than one idea. Two of the
    three allowed are sent into a sandbox as one file, stdlib only
    (sandboxes/resident.py, rl/verify/runner.py); the third is the run
    schema, where the sections meet (rl/config.py)."""
    long = sorted(
        (n, str(p.relative_to(REPO))) for p in _sources() if (n := len(p.read_text().splitlines())) > LONG_MODULE
    )
    assert len(long) <= MOST_LONG_MODULES, "\n".join(f"{n} lines: {where}" for n, where in reversed(long))


def test_no_test_writes_a_run_config_as_toml_text() -> None:
    """Run configs in the tests come from `conftest.run_config` (sections as
    dicts): a key renamed in the schema is then one edit, not a search
    through strings. A test of a malformed file may still write its text,
    without a [run] table."""
    found = [
        f"{p.name}:{node.lineno}"
        for p in sorted((REPO / "tests").glob("*.py"))
        if p.name != "test_layout.py"  # this test's own pattern
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "[run]\n" in node.value
    ]
    assert not found, found
