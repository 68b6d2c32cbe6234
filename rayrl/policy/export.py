"""`rayrl export RUN_DIR`: a trained policy as one ONNX or TorchScript file, runnable without Ray or
RLlib, with a JSON sidecar that says what goes in (the observation and its preprocessing) and what
comes out (the env action).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rayrl.args import Parser, fail
from rayrl.errors import EXIT_USAGE, SpecError
from rayrl.policy.checkpoints import find_checkpoint

FORMATS = ("onnx", "torchscript")
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}


def policy_net(module: Any, action_space: Any) -> Any:
    """A torch.nn.Module: obs [batch, *obs_shape] float32 -> (env action, RLlib's action distribution inputs).

    The action is the deterministic one: argmax of the logits (Discrete), or the Gaussian mean
    mapped onto the Box bounds and clipped, as RLlib's module-to-env connector does (unsquash_action).
    """
    import gymnasium as gym
    import torch

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module
            self.discrete = isinstance(action_space, gym.spaces.Discrete)
            if not self.discrete:
                self.size = int(np.prod(action_space.shape))
                self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
                self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            inputs = self.module.forward_inference({"obs": obs})["action_dist_inputs"]
            if self.discrete:
                return torch.argmax(inputs, dim=-1), inputs
            mean = inputs[..., : self.size].reshape(inputs.shape[:-1] + self.low.shape)
            action = self.low + (mean + 1.0) * (self.high - self.low) / 2.0
            return torch.minimum(torch.maximum(action, self.low), self.high), inputs

    return Policy().eval()


def export(module: Any, observation_space: Any, action_space: Any, fmt: str, out: Path) -> Path:
    """Write the policy to ``out`` as ONNX (batch dimension dynamic) or TorchScript (traced)."""
    import torch

    net = policy_net(module, action_space)
    example = torch.as_tensor(np.stack([observation_space.sample() for _ in range(2)]), dtype=torch.float32)
    with torch.no_grad():
        if fmt == "torchscript":
            torch.jit.save(torch.jit.trace(net, example, check_trace=False), str(out))
        else:
            torch.onnx.export(
                net,
                (example,),
                str(out),
                input_names=["obs"],
                output_names=["action", "dist_inputs"],
                dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}, "dist_inputs": {0: "batch"}},
                dynamo=False,
            )
    return out


def sidecar(
    spec: dict,
    observation_space: Any,
    action_space: Any,
    fmt: str,
    *,
    trial: str,
    checkpoint: Path,
    connectors: list[str],
) -> dict:
    """What the exported file expects and returns; written beside it as FILE.json."""
    import gymnasium as gym

    env = spec.get("env", {})
    action: dict = {"type": type(action_space).__name__, "shape": list(action_space.shape or ())}
    if isinstance(action_space, gym.spaces.Discrete):
        action.update(n=int(action_space.n), choice="argmax of dist_inputs (the logits)")
    else:
        action.update(
            low=np.asarray(action_space.low).tolist(),
            high=np.asarray(action_space.high).tolist(),
            choice="Gaussian mean mapped from [-1, 1] onto [low, high], clipped",
        )
    return {
        "format": fmt,
        "inputs": {"obs": f"float32 [batch, {', '.join(map(str, observation_space.shape))}]"},
        "outputs": {
            "action": "the env action (deterministic)",
            "dist_inputs": "RLlib's action distribution inputs: logits (Discrete) or mean and log std (Box)",
        },
        "env": {"id": env.get("id"), "config": env.get("config", {})},
        "observation": {"shape": list(observation_space.shape), "dtype": str(observation_space.dtype)},
        "action": action,
        "preprocessing": {
            "steps": "the env's observation as returned by env.step / env.reset (gymnasium.make(env.id, "
            "**env.config), wrappers included), cast to float32 and batched; nothing else",
            "normalisation": None if not any("MeanStd" in c for c in connectors) else "MeanStdFilter",
            "frame_stack": None,  # rayrl stacks no frames; an env (or factory) that does returns them in obs
            "rllib_env_to_module_connectors": connectors,
        },
        "algorithm": spec.get("algo", {}).get("name"),
        "trial_id": trial,
        "checkpoint": str(checkpoint),
    }


def build_parser() -> argparse.ArgumentParser:

    p = Parser(
        prog="rayrl export",
        description="Export the best (or --trial) trial's policy from a run folder "
        "as a standalone ONNX or TorchScript file (no Ray or RLlib needed to run it), with FILE.json "
        "beside it describing the observation it takes and the action it returns. ONNX needs the export "
        "extra: pip install 'rayrl[export]'.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder, {storage}/{name}")
    p.add_argument(
        "--trial",
        default=None,
        help="trial id (default: the sweep's best trial, or the one trial of a `rayrl train` run)",
    )
    p.add_argument("--format", default="onnx", choices=FORMATS, help="onnx (default) or torchscript")
    p.add_argument("--out", default=None, help="output file (default: RUN_DIR/policy.onnx or policy.pt)")
    return p


def main(argv: Sequence[str] | None = None) -> int:

    args = build_parser().parse_args(argv)
    try:
        if args.format == "onnx":
            from rayrl.extras import require

            require("onnx", "export", "rayrl export --format onnx")
        trial, checkpoint = find_checkpoint(args.run_dir, args.trial)
        out = Path(args.out) if args.out else Path(args.run_dir) / f"policy{SUFFIX[args.format]}"
        if not out.parent.is_dir():
            raise SpecError(f"--out: the folder {str(out.parent)!r} does not exist; give a file in an existing folder.")
        spec = _run_spec(Path(args.run_dir))
    except SpecError as exc:
        fail(str(exc))
        return EXIT_USAGE
    from rayrl.policy.checkpoints import connector_names, load_module

    module = load_module(checkpoint)
    export(module, module.observation_space, module.action_space, args.format, out)
    info = sidecar(
        spec,
        module.observation_space,
        module.action_space,
        args.format,
        trial=trial,
        checkpoint=checkpoint,
        connectors=connector_names(checkpoint),
    )
    Path(str(out) + ".json").write_text(json.dumps(info, indent=2))
    print(f"rayrl export: trial {trial} ({checkpoint.name}) -> {out} ({args.format}); preprocessing in {out}.json")
    return 0


def _run_spec(run_dir: Path) -> dict:
    """The spec the run trained with (spec.yaml), as plain data."""
    import yaml

    path = run_dir / "spec.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
