"""Cloud credentials of the nodes: what a process on a node (or a pickle it loads) can reach.

Without a role or service account in the file, Ray's autoscaler gives every node its own default:
on AWS the ``ray-autoscaler-v1`` instance profile (AmazonEC2FullAccess and AmazonS3FullAccess), on
GCP ``ray-autoscaler-sa-v1`` (storage.objectAdmin and compute.admin). Anyone holding the cluster
token then controls every bucket and VM of the account. rayrl's files name a head role (the
autoscaler's EC2/compute rights plus the run bucket's prefix) and a worker role (the prefix only):
cluster_configs/iam/. Each function returns problem sentences naming the key.
"""

from __future__ import annotations

AWS_DEFAULT = "ray-autoscaler-v1"
GCP_DEFAULT = "ray-autoscaler-sa-v1"


def _nodes(config: dict) -> dict[str, dict]:
    return {
        name: (node or {}).get("node_config") or {} for name, node in (config.get("available_node_types") or {}).items()
    }


def aws_profile(node_config: dict) -> str | None:
    """The instance profile a node config names (its Name, or the last part of its Arn)."""
    profile = node_config.get("IamInstanceProfile") or {}
    named = profile.get("Name") or (profile.get("Arn") or "").rsplit("/", 1)[-1]
    return named or None


def gcp_account(node_config: dict) -> str | None:
    accounts = node_config.get("serviceAccounts") or []
    return (accounts[0] or {}).get("email") if accounts else None


def credential_problems(config: dict) -> list[str]:
    """Every node names its own least-privilege identity; workers do not share the head's."""
    kind = (config.get("provider") or {}).get("type")
    if kind not in ("aws", "gcp"):
        return []
    head = config.get("head_node_type")
    key, read, default, fix = (
        ("IamInstanceProfile", aws_profile, AWS_DEFAULT, "cluster_configs/iam/aws-*.json")
        if kind == "aws"
        else ("serviceAccounts", gcp_account, GCP_DEFAULT, "cluster_configs/iam/gcp-roles.md")
    )
    what = "role" if kind == "aws" else "service account"
    problems = []
    identities = {}
    for name, node in _nodes(config).items():
        where = f"available_node_types.{name}.node_config.{key}"
        who = read(node)
        identities[name] = who
        if not who:
            problems.append(
                f"{where}: not set, so Ray gives the node its default identity ({default}: full "
                f"access to every bucket and VM of the account); name a {what} "
                f"that reaches only the run bucket's prefix ({fix})."
            )
        elif default in who:
            problems.append(
                f"{where}: {who!r} is Ray's default identity (full access to every bucket and VM of the "
                f"account); name a least-privilege one ({fix})."
            )
    head_identity = identities.get(str(head))
    for name, who in identities.items():
        if name != head and who and who == head_identity:
            problems.append(
                f"available_node_types.{name}.node_config.{key}: {who!r} is the head's identity, which "
                "may launch and delete instances (the autoscaler); give workers their own, with the run "
                f"bucket's prefix only ({fix})."
            )
    return problems


def is_policy(doc: dict) -> bool:
    """An AWS IAM policy document (cluster_configs/iam/aws-*.json)."""
    return "Statement" in doc and "Version" in doc


def _listed(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)] if value is not None else []


def policy_problems(doc: dict) -> list[str]:
    """A node role's policy grants no wildcard action and no bucket or role beyond its own."""
    problems = []
    statements = doc.get("Statement")
    if not isinstance(statements, list) or not statements:
        return ["Statement: must be a non-empty list of statements (see cluster_configs/iam/aws-rayrl-worker.json)."]
    for i, st in enumerate(statements):
        if not isinstance(st, dict) or st.get("Effect") != "Allow":
            continue
        where = f"Statement[{i}]" + (f" ({st['Sid']})" if st.get("Sid") else "")
        actions, resources = _listed(st.get("Action")), _listed(st.get("Resource"))
        wild = [a for a in actions if a == "*" or a.endswith(":*")]
        if wild:
            problems.append(f"{where}.Action: {', '.join(wild)} grants every action of a service; list the actions.")
        if any(a.startswith("s3:") for a in actions) and any(r in ("*", "arn:aws:s3:::*") for r in resources):
            problems.append(f"{where}.Resource: S3 actions on every bucket; name the run bucket's prefix.")
        if "iam:PassRole" in actions and any(r == "*" or r.endswith(":role/*") for r in resources):
            problems.append(f"{where}.Resource: iam:PassRole on every role; name the workers' role only.")
    return problems
