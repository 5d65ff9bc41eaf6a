"""The architecture DESIGN.md draws, checked on the source: each layer imports only layers below
it, and nothing imports in a cycle (imports inside functions count too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "inq"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the ``inq`` modules it names in any import statement, at any depth."""
    # conftest.py: pytest's set-up of the doctests, never imported by the library
    paths = {_module_name(p): p for p in ROOT.rglob("*.py") if p.name != "conftest.py"}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def _reachable(start: str) -> set[str]:
    graph, seen, todo = import_graph(), set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "inq.scheduler" in graph["inq.train.app"]
    assert "inq.codes" in graph["inq.kernels.ops"]


def test_no_import_cycle() -> None:
    cycles = sorted(name for name in import_graph() if name in _reachable(name))
    assert not cycles, f"modules that import themselves through others: {cycles}"


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("module", sorted(m for m in import_graph() if _under(m, "inq.kernels")))
def test_kernels_see_only_the_core_and_codes(module: str) -> None:
    allowed = ("inq.pow2", "inq.codes", "inq.kernels", "inq.fileio")  # its JSON figures too
    outside = sorted(m for m in import_graph()[module] if not _under(m, *allowed))
    assert not outside, f"{module} imports {outside}"


DEPLOYMENT = (
    "inq.nn",
    "inq.deploy",
    "inq.rtl",
    "inq.quant",
    "inq.artefact",
    "inq.cli",
    "inq.models",
    "inq.data",
)


@pytest.mark.parametrize("module", sorted(m for m in import_graph() if _under(m, "inq.quant")))
def test_integer_deployment_takes_batches_and_builds_no_datasets(module: str) -> None:
    assert not {m for m in _reachable(module) if _under(m, "inq.data")}, module


@pytest.mark.parametrize("module", sorted(m for m in import_graph() if _under(m, *DEPLOYMENT)))
def test_deployment_imports_nothing_from_train(module: str) -> None:
    training = sorted(m for m in _reachable(module) if _under(m, "inq.train"))
    assert not training, f"{module} reaches {training}"


@pytest.mark.parametrize("module", ["inq.pow2", "inq.partition", "inq.scheduler"])
def test_core_needs_no_training_app(module: str) -> None:
    assert not {m for m in _reachable(module) if _under(m, "inq.train")}


def test_importing_the_kernels_loads_no_scheduler() -> None:
    code = "import sys, inq.kernels; print(sorted(m for m in sys.modules if m.startswith('inq')))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    for module in ("inq.scheduler", "inq.masked", "inq.packed", "inq.train"):
        assert f"'{module}" not in loaded, loaded


def test_the_package_names_load_on_use() -> None:
    import inq

    for name in inq.__all__:
        assert getattr(inq, name) is not None
    assert sorted(inq.__all__) == sorted(inq._HOMES)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        inq.nope  # noqa: B018


LAYERS = (  # README's code map, top to bottom: each layer's tiers in import order
    # atomic writes, locks, digests, project manifests: nothing of inq but these, so anything may
    (("inq.fileio",), ("inq.project",)),
    (  # the core: rounding, then the level sets, the scheduler, the baselines on it
        ("inq.pow2", "inq.partition", "inq.prune", "inq.distill"),
        ("inq.levels",),
        ("inq.scheduler",),
        ("inq.baselines",),
    ),
    (("inq.codes",),),
    (("inq.kernels",),),
    (("inq.masked", "inq.sparse"), ("inq.packed",)),
    (("inq.errors", "inq.evaluation"), ("inq.models", "inq.data", "inq.fit", "inq.allocate")),
    # the opener returns integer models too (inq.quant.integer), so it, and what finds files
    # through it, sit below the integer model
    (("inq.nn",), ("inq.quant",), ("inq.artefact",), ("inq.runfiles",)),
    (("inq.rtl",), ("inq.deploy",)),  # what turns a finished model into a tool's or runtime's input
    (("inq.train", "inq.cli"), ("inq.console",)),
)
TIERS = [tier for layer in LAYERS for tier in layer]


def _unit(module: str) -> tuple[int, str]:
    """The tier a module sits in and the code-map entry (module or package) that holds it."""
    found = [(depth, prefix) for depth, tier in enumerate(TIERS) for prefix in tier
             if _under(module, prefix)]  # fmt: skip
    assert found, f"{module} is in no layer of the code map"
    return max(found, key=lambda entry: len(entry[1]))


@pytest.mark.parametrize("module", sorted(m for m in import_graph() if m != "inq"))
def test_each_module_imports_only_tiers_above_it(module: str) -> None:
    """Within a package anything goes; across entries, only what an earlier tier holds."""
    tier, unit = _unit(module)
    later = sorted(m for m in import_graph()[module] - {"inq"}
                   if _unit(m)[1] != unit and _unit(m)[0] >= tier)  # fmt: skip
    assert not later, f"{module} (tier {tier}) imports {later}"


def test_the_import_graph_has_no_more_levels_than_the_map_has_tiers() -> None:
    """The longest import chain between code-map entries (packages taken whole)."""
    edges: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        if module != "inq":
            unit = _unit(module)[1]
            edges.setdefault(unit, set()).update(_unit(t)[1] for t in targets - {"inq"})
    for unit, targets in edges.items():
        targets.discard(unit)

    @cache
    def levels(unit: str) -> int:
        return 1 + max((levels(t) for t in edges.get(unit, ())), default=0)

    assert max(levels(unit) for unit in edges) <= len(TIERS)


TRAIN = ROOT / "train"
LONGEST_TRAIN_FUNCTION = 60  # lines: each of the training app's functions reads in one screen


def test_the_trainer_fits_in_the_head() -> None:
    """The Trainer's module stays under 400 lines; its plan, factories, bars and integer phase
    live beside it."""
    assert len((TRAIN / "loop.py").read_text().splitlines()) < 400


@pytest.mark.parametrize("path", sorted(TRAIN.glob("*.py")), ids=lambda p: p.name)
def test_every_training_function_is_one_screen(path: Path) -> None:
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > LONGEST_TRAIN_FUNCTION
    ]
    assert not long, f"{path.name}: {long}"
