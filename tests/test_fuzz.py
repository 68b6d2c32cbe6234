"""Bad input: property-based fuzzing of every loader a user feeds, and CLI misuse of every command.

Loaders must fail with their own error class and a message naming what is wrong (never a stray
TypeError or a traceback), and a failed command must leave earlier results byte-for-byte as
they were. Hypothesis runs 1,500 examples in all (derandomized), about two minutes on a quiet
2-core machine.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_report import write_run

from rayrl import spec as S
from rayrl.cluster import cli as cluster
from rayrl.errors import SpecError
from rayrl.faults import drill
from rayrl.judge import doctor, evaluation, folder, report
from rayrl.judge.folder import RunFolderError

# No shrink phase: shrinking a run-folder failure took minutes; the failing example is printed as drawn.
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def fuzz(examples: int) -> settings:
    """Reproducible (derandomized) settings with ``examples`` examples."""
    return settings(FUZZ, max_examples=examples)


CONFIGS = sorted((ROOT / "experiments" / "configs").glob("*.yaml"))
CLUSTER_FILES = sorted((ROOT / "cluster_configs").rglob("*.yaml"))
FIELDS = [name for name, _, _ in S.field_table()]
KNOWN = set(FIELDS) | {f.rsplit(".", 1)[0] for f in FIELDS if "." in f} | {"spec"}

# ---------------------------------------------------------------------------------------------
# Strategies: YAML-like trees, and mutations of valid documents

# Import paths ('package.module:function') for env.id and hooks; names of at most 5 letters cannot spell a
# stdlib module with a visible side effect on import (antigravity).
import_paths = st.from_regex(r"\A\.{0,2}[a-z_]{0,5}(\.[a-z_]{0,3})?:[a-z_]{0,4}\Z")
leaves = (
    import_paths
    | st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "PPO",
            "APPO",
            "fp16",
            "asha",
            "CartPole-v1",
            "1e-4",
            "nan",
            ".x:y",
            "os:sep",
            "-1",
            "10**400",
            "",
            "  ",
            "~",
            "null",
            str(10**400),
            10**400,
            -(10**400),
        ]
    )
)
keys = (
    st.sampled_from(sorted({f.split(".")[-1] for f in FIELDS} | {f.split(".")[0] for f in FIELDS}))
    | st.text(max_size=8)
    | st.integers(-3, 3)
)
trees = st.recursive(
    leaves, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=5), max_leaves=24
)


def nest(flat: dict[str, object]) -> dict:
    """{"algo.lr": 1} -> {"algo": {"lr": 1}} (a later path wins over a clashing earlier one)."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else node
        node[last] = value
    return out


# Spec-shaped trees: real field paths with values of any type, so every field's checks are reached.
spec_trees = st.dictionaries(st.sampled_from(FIELDS), leaves | trees, max_size=8).map(nest)


def paths_of(tree: object, prefix: str = "") -> list[str]:
    """Dotted paths of every node of a tree ('' is the root)."""
    out = [prefix]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += paths_of(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def mutate(tree: dict, data: st.DataObject, n: int) -> dict:
    """Up to ``n`` random edits of a copy: replace a node, delete a key, add a key, change a type."""
    tree = copy.deepcopy(tree)
    for _ in range(n):
        parents = [node for node in sections(tree) if node]
        if not parents:
            break
        parent = data.draw(st.sampled_from(parents))
        key = data.draw(st.sampled_from(sorted(parent, key=str)))
        op = data.draw(st.sampled_from(["replace", "delete", "add", "wrap"]))
        if op == "replace":
            parent[key] = data.draw(trees)
        elif op == "delete":
            del parent[key]
        elif op == "add":
            parent[data.draw(keys)] = data.draw(trees)
        else:
            parent[key] = [parent[key]]
    return tree


def sections(tree: object) -> list[dict]:
    """Every mapping in a tree (in lists too), the root first."""
    if isinstance(tree, dict):
        return [tree] + [s for v in tree.values() for s in sections(v)]
    if isinstance(tree, list):
        return [s for v in tree for s in sections(v)]
    return []


def names_a_field(exc: SpecError, data: object) -> bool:
    """The message starts with the field it is about: a spec field or section, or a key of the input."""
    text = str(exc)
    named = KNOWN | set(paths_of(data)[1:])  # [1:]: not the root itself; a key may be '' though
    # a list field's message names the item, e.g. "model.conv_filters[0]: ..."
    return any(text.startswith((f"{p}:", f"{p}[")) for p in named) or text.startswith(("--set", "--config"))


# ---------------------------------------------------------------------------------------------
# The spec loader


def check_spec(data: object) -> None:
    try:
        spec = S.from_dict(data)  # type: ignore[arg-type]
    except SpecError as exc:
        assert names_a_field(exc, data), f"{exc!s} (input {data!r})"
        assert "Traceback" not in str(exc)
    else:
        assert S.from_dict(S.to_dict(spec)) == spec  # a valid spec round-trips


@fuzz(400)
@given(spec_trees | trees)
def test_random_trees_only_raise_spec_error_naming_the_field(data):
    check_spec(data if not isinstance(data, list) else {"algo": data})


@fuzz(150)
@given(import_paths | st.text(max_size=16))
def test_env_ids_only_raise_spec_error_naming_env_id(env_id):
    try:
        S.from_dict({"env": {"id": env_id}})
    except SpecError as exc:
        assert str(exc).startswith("env.id:"), exc


@fuzz(300)
@given(st.data())
def test_mutated_shipped_configs_only_raise_spec_error_naming_the_field(data):
    base = yaml.safe_load(data.draw(st.sampled_from(CONFIGS)).read_text())
    check_spec(mutate(base, data, data.draw(st.integers(1, 3))))


@fuzz(100)
@given(
    st.lists(
        st.text(max_size=24)
        | st.sampled_from(
            [
                "algo.lr=1e-4",
                "algo=3",
                "algo.lr.x=1",
                "=1",
                "a..b=1",
                "model.hidden=[1,",
                "stop={}",
                "env.id=!!python/none",
            ]
        ),
        max_size=4,
    ),
    st.binary(max_size=200) | st.text(max_size=200),
)
def test_spec_files_and_overrides_only_raise_spec_error(tmp_path, overrides, content):
    path = tmp_path / "spec.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    try:
        S.load(path, overrides)
    except SpecError as exc:
        assert names_a_field(exc, {}), exc  # the file (--config), an override (--set) or a field


# ---------------------------------------------------------------------------------------------
# `rayrl cluster validate`


@fuzz(150)
@given(st.data())
def test_cluster_validate_lists_problems_never_raises(tmp_path, data):
    source = data.draw(st.sampled_from(CLUSTER_FILES))
    docs = [d for d in yaml.safe_load_all(source.read_text()) if d is not None]
    docs = [mutate(d, data, data.draw(st.integers(1, 4))) if isinstance(d, dict) else d for d in docs]
    if data.draw(st.booleans()):
        docs[0] = data.draw(trees)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    problems = cluster.validate_file(path)
    assert isinstance(problems, list) and all(isinstance(p, str) and p.startswith(str(path)) for p in problems)


@fuzz(40)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_cluster_validate_on_arbitrary_bytes(tmp_path, content):
    path = tmp_path / "cluster.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    problems = cluster.validate_file(path)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)


# ---------------------------------------------------------------------------------------------
# Damaged run folders: folder.load, the report, the doctor and the notebooks' loading functions

RUN_FILES = ("spec.yaml", "summary.json", "history.csv", "doubling.csv", "trials.csv", "best_config.yaml", "drill.json")
DRILL = {"drills": [{"name": "env_runner", "outcome": "recovered", "recovery_s": 6.0}], "restore_rate": 1.0}


def damage(root: Path, data: st.DataObject) -> None:
    """One to three kinds of damage a crash, a full disk or a hand edit can do to a run folder."""
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(RUN_FILES))
        path = root / name
        text = path.read_text(errors="replace") if path.exists() else ""
        how = data.draw(st.sampled_from(["delete", "truncate", "garbage", "tree", "cell", "column"]))
        if how == "delete":
            path.unlink(missing_ok=True)
        elif how == "truncate":
            path.write_text(text[: int(data.draw(st.floats(0, 1)) * len(text))])
        elif how == "garbage":
            path.write_bytes(data.draw(st.binary(max_size=120)))
        elif how == "tree":
            tree = data.draw(trees)
            path.write_text(json.dumps(tree, default=str) if name.endswith(".json") else yaml.safe_dump(tree))
        elif name.endswith(".csv") and text:
            lines = text.splitlines()
            if how == "column":
                lines = [",".join(line.split(",")[1:]) for line in lines]
            else:
                row = data.draw(st.integers(0, 10**6)) % len(lines)
                cells = lines[row].split(",")
                cells[data.draw(st.integers(0, 10**6)) % len(cells)] = data.draw(
                    st.sampled_from(["", "nan", "inf", "-1", "x", "1e400", '"', "stop"])
                )
                lines[row] = ",".join(cells)
            path.write_text("\n".join(lines) + "\n")
        else:  # a JSON or YAML file: edit values inside it
            try:
                blob = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            except (ValueError, yaml.YAMLError):
                blob = None
            if isinstance(blob, dict) and blob:
                blob = mutate(blob, data, data.draw(st.integers(1, 2)))
                path.write_text(json.dumps(blob, default=str) if name.endswith(".json") else yaml.safe_dump(blob))


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def notebook_reads(run: folder.RunFolder) -> None:
    """What the analysis notebooks, the report and the doctor compute from a loaded folder."""
    folder.subject_history(run)
    folder.knee_batch(run)
    folder.best_trial_id(run)
    evaluation.evaluate(run)
    evaluation.run_costs(run)
    if run.kind == "sweep":
        evaluation.ladder_costs(run)
    doctor.diagnose(doctor.evidence([str(run.path)]))


@pytest.mark.slow  # 15 s: 300 damaged folders
@fuzz(300)
@given(st.data(), st.sampled_from(["sweep", "train"]))
def test_damaged_run_folders_raise_run_folder_error_only(tmp_path, data, kind):
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "run"
    write_run(root, kind, drill=DRILL)
    damage(root, data)
    try:
        run = folder.load(root)
        notebook_reads(run)
    except RunFolderError as exc:
        assert str(root) in str(exc) or "spec.yaml" in str(exc), exc


@pytest.mark.slow  # 21 s: 60 full reports
@fuzz(60)
@given(st.data())
def test_report_on_a_damaged_folder_exits_2_and_writes_nothing(tmp_path, capsys, data):
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "run"
    write_run(root, "sweep", drill=DRILL)
    damage(root, data)
    before = digest(root)
    status = report.main([str(root)])
    err = capsys.readouterr().err
    if status == 2:
        assert digest(root) == before and "Traceback" not in err and err.startswith("rayrl report: error:")
    else:
        assert status == 0 and (root / "report.md").exists()


# ---------------------------------------------------------------------------------------------
# CLI misuse: exit 2, one paragraph, earlier results untouched


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    """A finished sweep's run folder (synthetic) that a failed command must not change."""
    return write_run(tmp_path / "runs" / "earlier", "sweep", drill=DRILL)


def _sweep(argv: list[str]) -> int:
    from rayrl.sweep.cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def _rayrl(argv: list[str]) -> int:
    from rayrl.cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


CONFIG = str(ROOT / "experiments" / "configs" / "cartpole_ppo.yaml")


def misuse_cases(run: Path, tmp: Path) -> list[tuple[str, list[str], str]]:
    """(program, argv, text the error must contain) for every command."""
    storage, name = str(run.parent), run.name
    a_file = tmp / "a-file"
    a_file.write_text("not a folder")
    return [
        ("sweep", ["--bogus"], "unrecognized arguments"),
        ("sweep", ["--storage", storage, "--name", name, "--set", "algo.nosuch=1"], "algo.nosuch"),
        ("sweep", ["--storage", storage, "--name", name, "--set", "algo.lr"], "--set"),
        ("sweep", ["--storage", storage, "--name", name, "--set", "algo.lr.deeper=1"], "algo.lr"),
        ("sweep", ["--storage", storage, "--name", name, "--config", str(tmp / "missing.yaml")], "--config"),
        ("sweep", ["--storage", str(a_file / "sub"), "--name", name], "--storage"),
        ("sweep", ["--storage", storage, "--name", "../escape"], "--name"),
        ("rayrl", ["train", "--config", CONFIG, "--storage", storage, "--name", name, "--set", "stop=7"], "stop"),
        ("rayrl", ["train", "--config", CONFIG, "--storage", str(a_file), "--name", name], "--storage"),
        ("rayrl", ["report", str(run), "--bogus"], "unrecognized arguments"),
        ("rayrl", ["report", str(tmp / "missing")], "no such"),
        ("rayrl", ["doctor", str(tmp / "missing")], "no such"),
        ("rayrl", ["doctor"], "required"),
        ("rayrl", ["drill", str(tmp / "missing")], "no such"),
        ("rayrl", ["drill", str(a_file)], "is a file"),
        ("rayrl", ["drill", str(run), "--only", "everything"], "invalid choice"),
        ("rayrl", ["drill", str(run), "--num-cpus", "0"], "--num-cpus"),
        ("rayrl", ["cluster", "validate", str(tmp / "missing.yaml")], "no such file"),
        ("rayrl", ["cluster", "frobnicate"], "invalid choice"),
        ("rayrl", ["nosuchcommand"], "invalid choice"),
    ]


def test_cli_misuse_exits_2_with_one_paragraph_and_leaves_results_untouched(earlier_run, tmp_path, capsys):
    before = digest(earlier_run.parent)
    for program, argv, expected in misuse_cases(earlier_run, tmp_path):
        status = (_sweep if program == "sweep" else _rayrl)(argv)
        out = capsys.readouterr()
        text = out.err + out.out
        assert status == 2, (program, argv, text)
        assert expected in " ".join(text.split()), (program, argv, text)  # wrapped at 100 columns
        assert "Traceback" not in text, (program, argv, text)
        # one paragraph: argparse's usage block may precede it, but the error itself is one block
        error = text[text.index("error") :] if "error" in text else text
        assert "\n\n" not in error.strip(), (program, argv, text)
        assert digest(earlier_run.parent) == before, (program, argv, "changed the earlier run folder")


def test_drill_on_a_damaged_run_folder_exits_2_and_writes_nothing(earlier_run, capsys):
    (earlier_run / "spec.yaml").write_text("algo: {name: PPO, lr: -1}\n")
    before = digest(earlier_run)
    assert drill.main([str(earlier_run)]) == 2
    err = capsys.readouterr().err
    assert "spec.yaml" in "".join(err.split()) and "algo.lr" in err and "Traceback" not in err
    assert digest(earlier_run) == before and not (earlier_run / "drills").exists()
