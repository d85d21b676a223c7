"""The layers of the code, read from every module's imports (ast), including the imports
inside functions: a lazy import is still a dependency.

    1. minitensor imports nothing of parallel.
    2. parallel.comm imports no mechanism, planner, job or benchmark: of parallel only
       comm itself, alpha_beta (the α–β formulas, below both comm and plan) and launch;
       of minitensor only its dtype helpers (minitensor.dtypes).
    3. parallel.alpha_beta imports nothing; parallel.launch imports nothing of the project
       (it runs before numpy is imported).
    4. parallel.data_parallel imports no other axis (tensor_parallel, pipeline,
       context_parallel), not the composition root (hybrid) and not the job (train).
    5. An axis imports no other axis, but for the named exceptions below (EXCEPTIONS).
    6. parallel.checkpoint imports neither pipeline nor train.
    7. Only the benchmarks import the job (parallel.train): they time it.
    8. No two modules import each other, directly or through others (no cycles), but the
       engine's core (ENGINE_CORE): an op's Function makes Tensors, a Tensor's backward
       walks the Functions.

And the shape of the tree: at most 6 modules at the top of parallel/ (each axis is a
package), no library file over 300 lines.

The README's map of the code states the same rules.
"""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("minitensor", "parallel")
AXES = ("parallel.data_parallel", "parallel.tensor_parallel", "parallel.pipeline", "parallel.context_parallel")
# (importer, imported, why): where one axis may use another.
EXCEPTIONS = [
    ("parallel.tensor_parallel.sharding", "parallel.data_parallel.reducer",
     "the one gradient reducer also sums the sequence-parallel partial gradients over tp"),
    ("parallel.pipeline.tied", "parallel.data_parallel.reducer",
     "the one gradient reducer also sums the tied embedding's copies across the pipeline's ends"),
]
# The one cycle by design: Function.apply makes the Tensor an op returns, and Tensor.backward() walks the Functions.
ENGINE_CORE = ["minitensor.autograd", "minitensor.tensor"]


def module_name(path):
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source, name, is_package, modules):
    """The modules of `modules` that the code `source` of module `name` imports, anywhere in
    it. `from X import y` imports the module X.y if there is one, else X (y is a name in it);
    the parent packages every import initialises are not counted as edges."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                origin = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                origin = node.module
            found.update(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                         for alias in node.names)
    return {module for module in found if module in modules} - {name}


def project_modules():
    return {module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


MODULES = project_modules()
IMPORTS = {name: imported_modules(path.read_text(), name, path.name == "__init__.py", MODULES)
           for name, path in MODULES.items()}


def within(module, package):
    return module == package or module.startswith(package + ".")


def imports_of(package):
    return [(importer, imported) for importer, targets in IMPORTS.items() if within(importer, package)
            for imported in sorted(targets)]


def violations(package, allowed=None, forbidden=()):
    """(importer, imported) pairs of `package` that import outside `allowed` (prefixes, if
    given) or inside `forbidden`."""
    return [(a, b) for a, b in imports_of(package)
            if (allowed is not None and not any(within(b, ok) for ok in allowed))
            or any(within(b, bad) for bad in forbidden)]


def test_the_import_reader_sees_lazy_relative_and_from_imports():
    modules = {"parallel.pkg", "parallel.pkg.mod", "parallel.pkg.sibling", "parallel.comm", "parallel.comm.group",
               "minitensor.tensor", "parallel.launch"}
    source = ("from . import sibling\nfrom ..comm.group import Group\nfrom .. import launch\n"
              "def f():\n    import minitensor.tensor\n")
    assert imported_modules(source, "parallel.pkg.mod", False, modules) == {
        "parallel.pkg.sibling", "parallel.comm.group", "parallel.launch", "minitensor.tensor"}
    assert imported_modules("from .comm import Group\n", "parallel", True, modules) == {"parallel.comm"}


def test_minitensor_imports_nothing_of_parallel():
    assert violations("minitensor", forbidden=["parallel"]) == []


def test_comm_imports_only_itself_the_formulas_launch_dtypes_and_the_blas_thread_count():
    # minitensor.kernel_threads: ranks run as threads set BLAS to one thread each (run_threads)
    allowed = ["parallel.comm", "parallel.alpha_beta", "parallel.launch", "minitensor.dtypes", "minitensor.kernel_threads"]
    assert violations("parallel.comm", allowed) == []


def test_the_formulas_and_the_launcher_import_nothing_of_the_project():
    assert IMPORTS["parallel.alpha_beta"] == set() and IMPORTS["parallel.launch"] == set()


def test_data_parallel_imports_no_other_axis_nor_the_job():
    others = [axis for axis in AXES if axis != "parallel.data_parallel"]
    assert violations("parallel.data_parallel", forbidden=others + ["parallel.hybrid", "parallel.train"]) == []


@pytest.mark.parametrize("axis", AXES)
def test_an_axis_imports_another_only_where_an_exception_says_why(axis):
    excepted = {(a, b) for a, b, _ in EXCEPTIONS}
    others = [other for other in AXES if other != axis]
    assert [pair for pair in violations(axis, forbidden=others) if pair not in excepted] == []


def test_every_exception_is_still_needed():
    for importer, imported, why in EXCEPTIONS:
        assert imported in IMPORTS[importer], f"{importer} no longer imports {imported}: drop the exception ({why})"


def test_checkpoint_imports_neither_pipeline_nor_train():
    assert violations("parallel.checkpoint", forbidden=["parallel.pipeline", "parallel.train"]) == []


def test_only_the_benchmarks_import_the_job():
    importers = {a for a, targets in IMPORTS.items() for b in targets if within(b, "parallel.train")}
    assert {a for a in importers if not within(a, "parallel.train") and not within(a, "parallel.bench")} == set()


def test_no_import_cycles_but_the_engine_core():
    """Tarjan's strongly connected components over the import graph: every one a single module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(IMPORTS[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    assert [cycle for cycle in cycles if cycle != ENGINE_CORE] == []


def test_at_most_six_modules_at_the_top_of_parallel():
    top = sorted(p.name for p in (REPO / "parallel").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 6, top


def test_no_library_file_is_over_300_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 300}
    assert long == {}
