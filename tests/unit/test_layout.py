"""The house rules the layout depends on: the root the design card names, imports that flow one way (kernels <-
model <- nanoaha <- scripts, data's library below nanoaha), no import cycle, scripts import modules and never each
other (nor does any module import a script), and nothing points outside the repository."""
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
    assert {"model", "train", "nanoaha.training", "nanoaha.grid.runner", "kernels.attention"} <= set(modules)
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


def layer(module):
    """The layer a module belongs to: kernels, model, data (its library), nanoaha, or a script."""
    top = module.split(".")[0]
    if module in SCRIPTS or module.startswith("bench.") or module.endswith(".prepare") or module == "data.prepare":
        return "script"
    return {"kernels": "kernels", "model": "model", "data": "data", "nanoaha": "nanoaha"}.get(top, "script")


# what each layer may import of the project: imports flow one way, kernels <- model <- nanoaha <- scripts, and
# data's library under nanoaha (a low-level helper both need lives in data, the lowest of them)
MAY_IMPORT = {"kernels": {"kernels"}, "model": {"kernels", "model"}, "data": {"data"},
              "nanoaha": {"kernels", "model", "data", "nanoaha"},
              "script": {"kernels", "model", "data", "nanoaha", "script"}}


def test_layers_see_the_wrong_direction():
    assert layer("kernels.gates") == "kernels" and layer("data.loader") == "data"
    assert layer("data.python_stdlib.prepare") == "script" and layer("train") == "script"
    assert "nanoaha" not in MAY_IMPORT["data"] and "model" not in MAY_IMPORT["kernels"]


def test_imports_flow_one_way():
    graph = import_graph(project_modules())
    wrong = {name: sorted(dep for dep in deps if layer(dep) not in MAY_IMPORT[layer(name)])
             for name, deps in graph.items()}
    assert {name: deps for name, deps in wrong.items() if deps} == {}
    assert any(dep.startswith("kernels") for dep in graph["model"])  # the rule is checked on real edges
    assert {dep for dep in graph["model"] if not dep.startswith("kernels")} == set()


def test_the_root_holds_what_the_design_card_names():
    folders = {n for n in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, n)) and not n.startswith(".")}
    assert {"kernels", "data", "configs", "nanoaha", "docs", "tests", "bench", "results"} <= folders
    assert os.path.isfile(os.path.join(ROOT, "kernels", "attention.py"))
    assert not os.path.exists(os.path.join(ROOT, "nanoaha", "kernels"))


def test_transformers_finds_its_own_kernels_beside_the_projects():
    """transformers (>= 5) imports the installed `kernels` distribution, whose name the root kernels/ shares:
    nanoaha.gpt2_weights imports it in a scope where it finds its own; the project's kernels stay the ones its
    modules use."""
    import importlib.util
    import sys

    import kernels
    if importlib.util.find_spec("transformers") is None:
        return  # requirements.txt installs it; without it there is nothing to shadow
    from nanoaha.gpt2_weights import import_transformers
    transformers = import_transformers()
    assert transformers.GPT2LMHeadModel is not None
    assert sys.modules["kernels"] is kernels and kernels.__file__.startswith(ROOT)
    import kernels.attention  # still this project's
    assert kernels.attention.__file__.startswith(ROOT)


def calls_before_definition(path):
    """(caller, callee) pairs of top-level functions of a file where the callee is defined below its caller."""
    with open(path) as f:
        tree = ast.parse(f.read())
    defined = {node.name: i for i, node in enumerate(tree.body) if isinstance(node, ast.FunctionDef)}
    found = []
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.FunctionDef):
            found += [(node.name, n.id) for n in ast.walk(node)
                      if isinstance(n, ast.Name) and defined.get(n.id, -1) > i]
    return found


def test_train_py_reads_top_to_bottom(tmp_path):
    """What a function calls is defined above it, as nanoGPT's train.py reads."""
    bad = tmp_path / "bad.py"
    bad.write_text("def a():\n    return b()\n\n\ndef b():\n    return 1\n")
    assert calls_before_definition(str(bad)) == [("a", "b")]
    assert calls_before_definition(os.path.join(ROOT, "train.py")) == []


def test_every_file_the_gpu_check_runs_exists():
    """bench/gpu_check.sh ran tests/test_triton_attention.py after the tests moved to tests/e2e/: on a GPU the
    kernel tests would not have run (pytest: file not found). Every tests/ and bench/ path it names exists."""
    import re
    script = open(os.path.join(ROOT, "bench", "gpu_check.sh")).read()
    paths = set(re.findall(r"\b((?:tests|bench)/[\w/]+\.(?:py|sh))\b", script))
    assert {"tests/e2e/test_triton_attention.py", "bench/attention.py", "bench/train_speed.py"} <= paths
    missing = sorted(path for path in paths if not os.path.exists(os.path.join(ROOT, path)))
    assert not missing, f"bench/gpu_check.sh names files that do not exist: {missing}"
