"""`rayrl cluster validate`: check cluster YAMLs offline, before `ray up` or `kubectl apply`.

A bad cluster file is found late and paid for in GPU-hours. This module is the command line: it
reads each file, tells a launcher YAML (`rayrl.cluster.launcher`, with rayrl's rules in
`rayrl.cluster.launcher_rules`) from KubeRay manifests (`rayrl.cluster.kube`), and prints one line
per file or problem. Nothing here starts Ray or reaches a cloud. (The fake multinode config the
autoscaling tests use is tests/fake_multinode.py.)
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from rayrl.cluster import credentials, exposure
from rayrl.cluster.common import one_line
from rayrl.cluster.kube import validate_kube
from rayrl.cluster.launcher import validate_launcher
from rayrl.cluster.storage_rules import kind as lifecycle_kind
from rayrl.cluster.storage_rules import validate_lifecycle

EXIT_OK, EXIT_INVALID = 0, 2


def validate_file(path: str | Path) -> list[str]:
    """Problems with one cluster YAML (launcher or KubeRay), each a sentence naming key and fix."""
    p = Path(path)
    if not p.is_file():
        return [f"{p}: no such file; give a cluster YAML such as cluster_configs/gpu.yaml."]
    try:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        return [f"{p}: not valid YAML ({one_line(exc)}); fix the syntax at that line."]
    except UnicodeDecodeError:
        return [f"{p}: not a text file; give a cluster YAML."]
    if not docs:
        return [f"{p}: empty; a launcher YAML needs cluster_name, provider, ... (see cluster_configs/gpu.yaml)."]
    if any(not isinstance(d, dict) for d in docs):
        bad = next(type(d).__name__ for d in docs if not isinstance(d, dict))
        return [f"{p}: holds a {bad}, not a mapping of keys; a cluster YAML is key: value pairs."]
    if len(docs) == 1 and lifecycle_kind(docs[0]):
        problems = validate_lifecycle(docs[0])
    elif len(docs) == 1 and credentials.is_policy(docs[0]):
        problems = credentials.policy_problems(docs[0])
    elif all("apiVersion" in d or "kind" in d for d in docs):
        try:
            problems = [m for d in docs for m in validate_kube(d)] + exposure.kube_file_problems(docs)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            problems = [
                f"a section has an unexpected shape ({type(exc).__name__}: {one_line(exc)}); compare it "
                "with cluster_configs/kuberay/."
            ]
    elif len(docs) > 1:
        problems = [
            "holds several YAML documents; a launcher YAML (ray up) is one document, a KubeRay "
            "manifest gives every document an apiVersion and kind."
        ]
    else:
        problems = validate_launcher(docs[0])
    return [f"{p}: {m}" for m in problems]


def _expand(paths: Sequence[str]) -> Iterator[Path]:
    """Files as given, folders as their *.yaml, *.yml and *.json files (sorted), so a folder is checked whole."""
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml", ".json") and q.is_file())
        else:
            yield p


def build_parser() -> argparse.ArgumentParser:
    """The `rayrl cluster` parser; validate's --help lists what is checked, so users need not read code."""
    parser = argparse.ArgumentParser(
        prog="rayrl cluster",
        description="Check cluster configs offline, before they cost GPU-hours. Nothing "
        "is started and no cloud is contacted.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate = sub.add_parser(
        "validate",
        help="validate launcher YAMLs (ray up), KubeRay manifests and bucket lifecycle rules",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
            Validate cluster YAMLs; prints one OK line per valid file, exits 2 if any file is invalid.

            Launcher YAMLs (ray up): Ray's own schema after Ray's own default-filling, then rayrl's
            rules: a known provider.type, no key left for Ray's defaults to fill, node types
            labelled rayrl.io/role: learner have GPUs, the Docker image runs the installed Ray,
            token auth on (token from a mounted file, never RAY_AUTH_TOKEN inline), dashboard on
            127.0.0.1, --metrics-export-port=8080, no security group open to the world,
            min_workers <= max_workers, rayrl installed at this checkout's version, every port
            `ray start` opens named by a flag (so a firewall can admit exactly those), core dumps
            off (no `ulimit -c unlimited`, docker --ulimit core=0), on GCP no external IP on any
            node (networkInterfaces without accessConfigs, use_internal_ips: true).
            KubeRay manifests (RayCluster, RayJob, Volcano Queue, NetworkPolicy): kind and
            apiVersion, rayVersion and image tags equal the installed Ray, authOptions.mode token
            and no token in env, a GPU worker group with nvidia.com/gpu limits equal to requests,
            minReplicas <= maxReplicas, ClusterIP head service, a RayJob entrypoint and
            backoffLimit >= 1, a Queue capability; every pod template labelled rayrl.io/cluster and
            a NetworkPolicy in the same file that fences those pods in (no rule open to everyone);
            a securityContext on every container (runAsNonRoot, no privilege escalation, read-only
            root, capabilities drop ALL); gcsFaultToleranceOptions with an external Redis whose
            password comes from a Secret.

             files (S3 `Rules`, GCS `rule`, JSON): the guide's tiers (warm on day
            7, archive on day 37), transitions to ever colder classes the cloud accepts, a prefix
            filter, no deletion before archive, clean-up of interrupted multipart uploads."""),
        epilog="example: rayrl cluster validate cluster_configs/gpu.yaml cluster_configs/kuberay/",
    )
    validate.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="cluster YAML or lifecycle JSON, or a folder whose *.yaml / *.yml / *.json files "
        "(subfolders too) are all checked",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """`rayrl cluster ARGS`: exit 0 when every file is valid, 2 otherwise (or on bad usage)."""
    args = build_parser().parse_args(argv)
    status = EXIT_OK
    files = list(_expand(args.files))
    if not files:
        print("rayrl cluster validate: no YAML files found in " + ", ".join(args.files), file=sys.stderr)
        return EXIT_INVALID
    for path in files:
        problems = validate_file(path)
        if problems:
            status = EXIT_INVALID
            for problem in problems:
                print(f"INVALID {problem}", file=sys.stderr)
        else:
            print(f"OK {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
