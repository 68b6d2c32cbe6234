"""Optional extras (pyproject's tracking, export, notebooks, bench): one clear line when one is missing."""

from __future__ import annotations

import importlib.util

from rayrl.errors import SpecError

EXTRAS = {
    "tracking": "mlflow, wandb, tensorboard",
    "export": "onnx, onnxruntime, moviepy (rayrl play --video)",
    "notebooks": "jupyterlab, matplotlib",
    "bench": "stable-baselines3",
}


def require(module: str, extra: str, needed_by: str) -> None:
    """Raise SpecError naming the pip command when ``module`` is not importable."""
    if importlib.util.find_spec(module) is None:
        raise SpecError(
            f"{needed_by} needs {module}, which is not installed; run: pip install "
            f"'rayrl[{extra}]' (it installs {EXTRAS[extra]})."
        )
