"""The README stays true: its quick start is what CI and the tests run, its commands and files exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, subprocess_env

README = (ROOT / "README.md").read_text()


def quick_start() -> list[str]:
    block = re.search(r"(?is)quick ?start.*?```(?:bash|sh|shell)\n(.*?)```", README).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def main_job_command() -> list[str]:
    """The job step of the quick start's first command: `python experiments/sweep.py`."""
    return shlex.split(quick_start()[0].split("&&")[-1])


def test_quick_start_is_two_commands_setup_and_job_then_setup_and_tests():
    first, second = quick_start()
    for command in (first, second):
        assert "python3 -m venv .venv" in command and "pip install torch==2.13.0" in command
    assert main_job_command() == ["python", "experiments/sweep.py"]
    assert second.split("&&")[-1].strip().startswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "commands[1]" in ci and 'bash -c "$test_cmd"' in ci  # CI runs the second command verbatim


def test_every_path_the_readme_names_exists():
    named = set(
        re.findall(
            r"`((?:experiments|cluster_configs|notebooks|docs|monitoring|benchmarks|rayrl)"
            r"/[\w./-]*)`",
            README,
        )
    )
    named |= set(re.findall(r"\((docs/[\w.-]+)\)", README))
    named = {p for p in named if not p.startswith("rayrl/") or p.endswith(".py")}  # rayrl/x is also a metric key
    assert len(named) > 10
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert missing == []


def _commands_in_code_blocks() -> list[list[str]]:
    commands = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", README, re.S):
        if lang not in ("", "bash", "sh", "shell"):  # a ```text block shows output, not commands
            continue
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith(("rayrl ", "python experiments/")):
                commands.append(shlex.split(line.replace("[", "").replace("]", "").replace("...", "")))
    return commands


@pytest.mark.parametrize("program", ["train", "spec", "cluster", "report", "doctor", "drill", "plan", "export", "play"])
def test_each_documented_rayrl_command_has_help(program):
    documented = {c[1] for c in _commands_in_code_blocks() if c[0] == "rayrl"}
    assert program in documented
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", program, "--help"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout.lower()
    assert "%%" not in proc.stdout  # argparse leaves a description's %% as is


def test_sweep_help_lists_the_documented_flags():
    proc = subprocess.run(
        [sys.executable, "experiments/sweep.py", "--help"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0
    for flag in ("--config", "--name", "--storage", "--set", "--smoke"):
        assert flag in proc.stdout
    assert "%%" not in proc.stdout and "< 15%" in proc.stdout  # argparse leaves a description's %% as is


def test_readme_cluster_validate_command_passes_on_the_shipped_configs():
    line = next(text for text in README.splitlines() if text.startswith("rayrl cluster validate"))
    args = shlex.split(line.split("#")[0])
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", *args[1:]],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") >= 6


def test_readme_spec_section_names_every_field_rayrl_spec_prints():
    """Field by field: every leaf `rayrl spec` prints appears, in backticks, in its section's bullet
    (top-level fields in the section's opening sentence)."""
    from rayrl.spec import field_table

    section = README[README.index("## The spec") : README.index("## Running on a cluster")]
    intro = section[: section.index("\n- `")]
    missing = []
    for name, _default, _doc in field_table():
        top, *rest = name.split(".")
        if not rest:
            found = f"`{top}`" in intro
        else:
            bullet = re.search(rf"^- `{top}`:(.*?)(?=^- `|\Z)", section, re.S | re.M)
            found = bullet is not None and f"`{rest[-1]}`" in bullet.group(1)
        if not found:
            missing.append(name)
    assert missing == [], f"README's spec section misses {missing}"
