"""The package's layers: each imports only from its own layer and those below it, and no module imports
itself back through others (every import counts, a lazy one inside a function as much as one at the top)."""

from __future__ import annotations

import ast
from pathlib import Path

from dl2.paths import PACKAGE_DIR

# lowest first
LAYERS = (
    ("foundation", ("dl2", "dl2.errors", "dl2.paths", "dl2.checkout", "dl2.config", "dl2.plots")),
    ("workload: job types, speeds, traces, presets", ("dl2.workload",)),
    ("the simulated cluster: state, placement, slot steps, results", ("dl2.sim", "dl2.metrics", "dl2.capacity_bound")),
    ("schedulers: the scheduler and backend protocols, the heuristics", ("dl2.schedulers",)),
    ("distribution: the executor setting, jobs in processes or Ray tasks, a Ray cluster on this machine", ("dl2.distributed",)),
    ("the Pollux world: its applications, job model, cluster, policies and workloads", ("dl2.pollux",)),
    ("learning: DL2", ("dl2.learn",)),
    ("the Kubernetes API client: objects, DL2Job specs, leases", ("dl2.kube",)),
    ("testbeds: the local control plane and kind, their binaries and images, the training pods' code", ("dl2.testbed",)),
    ("backends and the slot loop: the simulator, Kubernetes; their environments; Gymnasium", ("dl2.backends", "dl2.gym_env")),
    ("sim-to-real experiments: profiling, replay, the report's section", ("dl2.sim_to_real",)),
    ("pipeline and command line", ("dl2.stages", "dl2.stage_configs", "dl2.notebooks", "dl2.tracking", "dl2.compare", "dl2.bound_tightness",
                                   "dl2.worlds", "dl2.reproduction", "dl2.publish", "dl2.score", "dl2.bench", "dl2.bench_ray",
                                   "dl2.bench_clusters", "dl2.bench_pollux", "dl2.bench_pollux_sl", "dl2.bench_record",
                                   "dl2.bench_pollux_env", "dl2.bench_bound", "dl2.bench_pipeline", "dl2.bench_score",
                                   "dl2.cli",
                                   "dl2.testbed_cli")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}


def layer(module: str) -> int:
    """The index of the layer `module` belongs to (the longest package prefix that names one)."""
    matches = [(len(prefix), k) for k, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} belongs to no layer: add it to LAYERS"
    return max(matches)[1]


def imports(module: str) -> set[str]:
    """The dl2 modules `module` imports anywhere in its file (`from dl2.x import y` counts `dl2.x.y` when that is a module)."""
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("dl2")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dl2"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES}
    return {name for name in found if name in MODULES} - {module}


def test_every_module_belongs_to_a_layer():
    for module in MODULES:
        layer(module)


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{module} ({LAYERS[layer(module)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
              for module in sorted(MODULES) for target in sorted(imports(module)) if layer(target) > layer(module)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    graph = {module: imports(module) - {"dl2"} for module in MODULES}  # the package's own __init__ holds nothing
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(target):], target]))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_a_backend_is_handed_its_testbed_never_fetches_it():
    """Backends get a kubeconfig or a pod cluster from whoever started the testbed (`dl2.testbed.running`); they
    may use the pods' progress format (`dl2.testbed.training.progress`) but never start or look up a testbed."""
    reaching = [f"{module} imports {target}" for module in sorted(MODULES) if module.startswith("dl2.backends")
                for target in sorted(imports(module))
                if target.startswith("dl2.testbed") and not target.startswith("dl2.testbed.training")]
    assert not reaching, "\n".join(reaching)
