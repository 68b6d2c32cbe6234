"""The run folder's trust boundary (rayrl.security.trust): control characters, symlinks, foreign owners and
shared write access are refused with exit 2 before anything is written or Ray starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rayrl import runtime
from rayrl.errors import SpecError
from rayrl.security import trust

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "experiments" / "configs" / "cartpole_ppo.yaml")


@pytest.mark.parametrize("name", ["a\x00b", "run\x1b[31m", "x\x7f", "tab\there", "new\nline", "c1\x85"])
def test_every_control_character_in_a_name_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match=r"--name: .* contains control characters \(U\+"):
        trust.check_name(name)


def test_ordinary_names_pass() -> None:
    for name in ("cartpole-ppo", "run_2.1", "Läufe-β"):
        trust.check_name(name)


def test_a_symlinked_run_folder_is_refused_even_when_shared_runs_are_allowed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "exp").symlink_to(target)
    for allow in (False, True):
        with pytest.raises(SpecError, match="symbolic link"):
            runtime.resolve(str(tmp_path / "runs"), "exp", allow_shared=allow)
    assert list(target.iterdir()) == []  # nothing written through the link


@pytest.mark.parametrize("mode, who", [(0o777, "everyone"), (0o775, "its group")])
def test_a_run_folder_others_can_write_is_refused_unless_allowed(tmp_path: Path, mode: int, who: str) -> None:
    run = tmp_path / "exp"
    run.mkdir()
    run.chmod(mode)
    with pytest.raises(SpecError, match=f"writable by {who}.*--allow-shared-run-dir"):
        runtime.resolve(str(tmp_path), "exp")
    assert runtime.resolve(str(tmp_path), "exp", allow_shared=True).run_dir == run


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_run_folder_of_another_user_is_refused_unless_allowed(tmp_path: Path) -> None:
    run = tmp_path / "exp"
    run.mkdir(mode=0o755)
    os.chown(run, 4242, 4242)
    with pytest.raises(SpecError, match="belongs to user id 4242"):
        runtime.resolve(str(tmp_path), "exp")
    runtime.resolve(str(tmp_path), "exp", allow_shared=True)


def _snapshot(root: Path) -> dict[str, float]:
    return {str(p): p.lstat().st_mtime for p in root.rglob("*")}


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_the_cli_exits_2_with_one_paragraph_and_writes_nothing(tmp_path: Path, capsys, command: str) -> None:
    from rayrl.cli import main as rayrl_main
    from rayrl.sweep.cli import main as sweep_main

    storage = tmp_path / "runs"
    storage.mkdir()
    (storage / "linked").symlink_to(tmp_path)
    shared = storage / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    nul_spec = tmp_path / "nul.yaml"
    nul_spec.write_text(Path(CONFIG).read_text() + '\nname: "bad\\0name"\n')
    before = _snapshot(tmp_path)
    cases = [
        (["--config", CONFIG, "--name", "esc\x1bname"], "control characters"),
        (["--config", str(nul_spec)], "U+0000"),
        (["--config", CONFIG, "--name", "linked"], "symbolic link"),
        (["--config", CONFIG, "--name", "shared"], "writable by everyone"),
    ]
    for argv, expected in cases:
        argv = argv + ["--storage", str(storage)]
        status = rayrl_main(["train", *argv]) if command == "train" else sweep_main(argv)
        text = " ".join((capsys.readouterr().err).split())
        assert status == 2 and expected in text and "Traceback" not in text, (argv, text)
    assert _snapshot(tmp_path) == before
