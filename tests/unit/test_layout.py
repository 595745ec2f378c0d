"""The house rules the layout depends on: no import cycle among the project's modules, scripts import modules
and never each other (nor does any module import a script), and nothing points outside the repository."""
import ast
import os

from helpers import ROOT

SCRIPTS = {"train", "sample", "evaluate", "prune", "probe", "compare"}  # what a user runs, at the root
SKIP = {".git", ".venv", ".venv-ci", "results", "tests", "configs", "__pycache__", "out"}


def project_modules():
    """{dotted name: path} of every Python module outside tests/, configs/ and the records."""
    modules = {}
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in SKIP and not d.startswith(".")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path
    return modules


def import_graph(modules):
    """{module: the project modules it imports}, function-level imports included."""
    graph = {}
    for name, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = found & set(modules)
    return graph


def cycles(graph):
    """Every import cycle, each as the sorted tuple of its modules."""
    found, done = set(), set()

    def visit(node, path):
        for dep in graph[node]:
            if dep in path:
                found.add(tuple(sorted(path[path.index(dep):])))
            elif dep not in done:
                visit(dep, path + [dep])
        done.add(node)

    for node in graph:
        if node not in done:
            visit(node, [node])
    return found


def test_the_graph_sees_a_cycle_and_an_import_of_a_script():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"train"}, "train": set()}
    assert cycles(graph) == {("a", "b", "c")} and cycles({"a": {"b"}, "b": set()}) == set()


def test_no_import_cycle_and_no_module_imports_a_script():
    modules = project_modules()
    assert {"model", "train", "nanoaha.training", "nanoaha.grid.runner", "nanoaha.kernels.attention"} <= set(modules)
    graph = import_graph(modules)
    assert cycles(graph) == set()
    assert {name: deps & SCRIPTS for name, deps in graph.items() if deps & SCRIPTS} == {}


def test_the_root_shows_the_model_and_the_scripts():
    root_files = {n[:-3] for n in os.listdir(ROOT) if n.endswith(".py")}
    assert root_files == SCRIPTS | {"model"}


def test_nothing_points_outside_the_repository():
    """Code and docs never name ../shared (a folder of this machine, not of a user's clone)."""
    hits = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in {".git", ".venv", ".venv-ci", "__pycache__", "out"}]
        for name in files:
            if name.endswith((".py", ".md", ".sh", ".toml", ".txt")):
                path = os.path.join(folder, name)
                with open(path, errors="replace") as f:
                    if "../shared" in f.read() and os.path.relpath(path, ROOT) != "tests/unit/test_layout.py":
                        hits.append(os.path.relpath(path, ROOT))
    assert hits == []


def test_no_root_module_shadows_an_installed_package():
    """The root is first on sys.path for every script, so a root folder or file named like an installed package
    hides it from its users: a root kernels/ broke `import transformers` (>= 5), which imports the `kernels`
    distribution. Checked against what this environment installed from requirements.txt."""
    import importlib.metadata
    installed = importlib.metadata.packages_distributions()
    root_names = {n[:-3] if n.endswith(".py") else n for n in os.listdir(ROOT)
                  if n.endswith(".py") or os.path.isfile(os.path.join(ROOT, n, "__init__.py"))}
    assert "nanoaha" in root_names
    assert {name: installed[name] for name in root_names if name in installed} == {}
