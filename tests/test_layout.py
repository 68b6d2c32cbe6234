"""The package's shape: no import cycle, each module imports only layers below its own, and the
README's layout names every module (so the map a maintainer reads is the tree)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "rayrl"

#: Each module's layer (longest matching prefix wins). A module may import its own package's modules
#: and any module of a lower layer; never a higher one, nor another package of its own layer.
LAYERS = {
    "rayrl.errors": 0,
    "rayrl.args": 1,
    "rayrl.extras": 1,
    "rayrl.runfolder": 1,
    "rayrl.security": 1,
    "rayrl.spec": 2,
    "rayrl.storage": 3,
    "rayrl.envs": 3,
    "rayrl.faults.watchdog": 3,
    "rayrl.sampling": 4,  # the fast runner's vector envs build on rayrl.envs (Atari ids, preprocessing)
    "rayrl.observe": 4,
    "rayrl.runtime": 4,
    "rayrl.faults.preemption": 4,
    "rayrl.track": 5,
    "rayrl.policy": 5,
    "rayrl.rllib": 6,
    "rayrl.tune": 7,
    "rayrl.sweep": 8,
    "rayrl.train": 8,
    "rayrl.judge": 8,
    "rayrl.scale": 9,
    "rayrl.faults": 9,
    "rayrl.cluster": 9,
    "rayrl.cli": 10,
    "rayrl": 10,
}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


MODULES = module_names()


def imports(path: Path, *, top_level_only: bool) -> set[str]:
    """The rayrl modules ``path`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs or {node.module}
    return {m for m in found if m in MODULES}


def layer(module: str) -> tuple[int, str]:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix], prefix


def test_every_module_has_a_layer():
    assert all(layer(m) for m in MODULES)


def test_no_import_cycle_between_modules():
    graph = {m: imports(p, top_level_only=True) for m, p in MODULES.items()}
    done: set[str] = set()

    def visit(m: str, stack: list[str]) -> None:
        if m in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(m) :] + [m])}")
        if m in done:
            return
        for dep in graph[m]:
            visit(dep, [*stack, m])
        done.add(m)

    for m in graph:
        visit(m, [])


def test_no_module_imports_a_layer_above_its_own():
    wrong = []
    for m, path in MODULES.items():
        mine, my_prefix = layer(m)
        for dep in imports(path, top_level_only=False):
            theirs, their_prefix = layer(dep)
            if my_prefix == their_prefix or their_prefix == "rayrl" and dep != "rayrl":
                continue
            if theirs > mine or (theirs == mine and my_prefix != their_prefix):
                wrong.append(f"{m} (layer {mine}) imports {dep} (layer {theirs})")
    assert wrong == []


def test_the_judge_never_imports_the_sweep_or_ray():
    """The report, the doctor and the notebooks read a run folder on a laptop: no sweep runner, no Ray."""
    import subprocess
    import sys

    code = (
        "import sys; import rayrl.judge.report, rayrl.judge.doctor, rayrl.judge.folder; "
        "print(sorted(m for m in sys.modules if m.startswith(('rayrl.sweep', 'rayrl.tune.tuner', 'ray.', "
        "'rllib', 'torch')) or m == 'ray'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_readme_layout_names_every_module():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Layout") :]
    block = block[: block.index("\n## ") if "\n## " in block else len(block)]
    named = set(re.findall(r"\b([a-z_]+\.py)\b", block)) | set(re.findall(r"\b([a-z_]+)/", block))
    missing = []
    for _module, path in MODULES.items():
        if path.name == "__init__.py":
            if path.parent != PACKAGE and path.parent.name not in named:
                missing.append(f"{path.parent.name}/")
        elif path.name not in named:
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "notebooks").glob("*.ipynb"))]


def test_every_module_and_name_the_docs_cite_exists():
    """`rayrl.x.y` and `rayrl/x/y.py` in README.md, docs/ and the notebooks name real modules and attributes
    (a move that leaves a doc behind fails here). Names whose first part is no module of the package
    (labels such as rayrl.io/cluster, tags such as rayrl.phase) are not code references."""
    import importlib

    packages = {m.split(".")[1] for m in MODULES if "." in m}
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for path in set(re.findall(r"\brayrl/[\w/]+\.py\b", text)):
            if not (ROOT / path).exists():
                wrong.append(f"{doc.name}: {path}")
        for name in set(re.findall(r"\brayrl(?:\.[A-Za-z_]\w*)+", text)):
            parts = name.split(".")
            if parts[1] not in packages:
                continue
            depth = max(i for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in MODULES)
            obj = importlib.import_module(".".join(parts[:depth]))
            for attr in parts[depth:]:
                if not hasattr(obj, attr):
                    wrong.append(f"{doc.name}: {name}")
                    break
                obj = getattr(obj, attr)
    assert sorted(wrong) == []


def test_every_source_path_the_code_names_exists():
    """`rayrl/x/y.py` strings in the package, the benchmarks and the tests (a profiler's frame filter, a
    message) name files that exist."""
    wrong = []
    here = Path(__file__).resolve()
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tests").glob("*.py")]:
        if path.resolve() == here:  # its own docstrings show the pattern
            continue
        for named in set(re.findall(r"\brayrl/[\w/]+\.py\b", path.read_text())):
            if not (ROOT / named).exists():
                wrong.append(f"{path.relative_to(ROOT)}: {named}")
    assert wrong == []
