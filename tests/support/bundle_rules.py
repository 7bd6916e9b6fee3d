"""What `databricks bundle validate/deploy -t <target>` would refuse in databricks.yml.

No workspace is reachable here, so the CLI cannot run. Two stand-ins:

- the resources against the typed bundle models of the databricks-bundles package
  (pinned in requirements.lock; generated from the same specification as the CLI's
  JSON schema, and released with the CLI of the same version): an unknown field or
  an enum value the models do not have raises ValueError, as the schema refuses it;
- the CLI's production-mode rules, re-stated from its source (databricks/cli,
  bundle/config/mutator/resourcemutator/validate_target_mode.go, run_as.go and
  apply_bundle_permissions.go, read at commit 7bbe285 of 2026-08-21), plus the
  Jobs service's rule that a dedicated cluster runs only for its single user.

For tests/unit/test_databricks_bundle.py: each function returns the problems
it found, an empty list for a valid bundle.
"""

from __future__ import annotations

import copy
from typing import Any, cast

# apply_bundle_permissions.go: the levels a bundle's `permissions` may grant.
BUNDLE_PERMISSION_LEVELS = {"CAN_MANAGE", "CAN_VIEW", "CAN_RUN"}
PRINCIPAL_KEYS = ("user_name", "service_principal_name", "group_name")
DEDICATED_MODES = {"DATA_SECURITY_MODE_DEDICATED", "SINGLE_USER"}
# The top-level sections of a bundle (and of a target, which overrides them).
TOP_LEVEL = {
    "bundle",
    "include",
    "variables",
    "workspace",
    "artifacts",
    "resources",
    "targets",
    "run_as",
    "permissions",
    "sync",
    "presets",
    "experimental",
    "scripts",
    "python",
}
TARGET_KEYS = {
    "mode",
    "default",
    "workspace",
    "run_as",
    "permissions",
    "resources",
    "variables",
    "artifacts",
    "bundle",
    "cluster_id",
    "compute_id",
    "git",
    "presets",
    "sync",
}


def target_view(bundle: dict[str, Any], target: str) -> dict[str, Any]:
    """The bundle as the CLI sees it for one target: the target's sections merged over
    the top level (maps key by key, job clusters by job_cluster_key)."""
    merged = {key: copy.deepcopy(value) for key, value in bundle.items() if key != "targets"}
    override = bundle["targets"][target] or {}
    for key, value in override.items():
        if key == "resources":
            _merge_resources(merged.setdefault("resources", {}), value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_resources(base: dict[str, Any], override: dict[str, Any]) -> None:
    for kind, resources in override.items():
        for name, fields in resources.items():
            resource = base.setdefault(kind, {}).setdefault(name, {})
            for key, value in fields.items():
                if key == "job_clusters":
                    _merge_job_clusters(resource.setdefault("job_clusters", []), value)
                else:
                    resource[key] = copy.deepcopy(value)


def _merge_job_clusters(base: list[dict[str, Any]], overrides: list[dict[str, Any]]) -> None:
    by_key = {cluster["job_cluster_key"]: cluster for cluster in base}
    for override in overrides:
        cluster = by_key.get(override["job_cluster_key"])
        if cluster is None:
            base.append(copy.deepcopy(override))
            continue
        cluster["new_cluster"] = {**cluster.get("new_cluster", {}), **override["new_cluster"]}


def model_problems(bundle: dict[str, Any]) -> list[str]:
    """Sections and jobs the bundle models refuse (unknown field, bad enum value)."""
    from databricks.bundles.jobs import Job, JobPermission, JobPermissionDict, JobRunAs

    problems = [f"unknown top-level section {key!r}" for key in set(bundle) - TOP_LEVEL]
    for name, target in (bundle.get("targets") or {}).items():
        problems += [
            f"target {name!r}: unknown section {key!r}" for key in set(target or {}) - TARGET_KEYS
        ]
        if (target or {}).get("mode") not in (None, "development", "production"):
            problems.append(f"target {name!r}: mode must be development or production")
    for target in bundle.get("targets") or {}:
        view = target_view(bundle, target)
        for name, job in (view.get("resources", {}).get("jobs") or {}).items():
            try:
                Job.from_dict(copy.deepcopy(job))
            except (ValueError, TypeError) as exc:
                problems.append(f"target {target!r} job {name!r}: {exc}")
        if "run_as" in view:
            try:
                JobRunAs.from_dict(copy.deepcopy(view["run_as"]))
            except (ValueError, TypeError) as exc:
                problems.append(f"target {target!r} run_as: {exc}")
        for permission in view.get("permissions") or []:
            # principal fields, same model; from_dict is what checks the YAML's shape
            as_job = cast(JobPermissionDict, {**permission, "level": "CAN_VIEW"})
            try:
                JobPermission.from_dict(as_job)
            except (ValueError, TypeError) as exc:
                problems.append(f"target {target!r} permission {permission}: {exc}")
            if permission.get("level") not in BUNDLE_PERMISSION_LEVELS:
                problems.append(
                    f"target {target!r} permission level {permission.get('level')!r}: "
                    f"expected one of {sorted(BUNDLE_PERMISSION_LEVELS)}"
                )
    return problems


def run_as_identity(view: dict[str, Any]) -> str | None:
    run_as = view.get("run_as") or {}
    return run_as.get("service_principal_name") or run_as.get("user_name")


def production_problems(bundle: dict[str, Any], target: str) -> list[str]:
    """Why the CLI (or the Jobs service) would refuse `deploy -t <target>` in production
    mode, deployed by a person: errors, and the recommendations we treat as errors."""
    override = bundle["targets"][target] or {}
    if override.get("mode") != "production":
        return [f"target {target!r} is not mode: production"]
    view = target_view(bundle, target)
    problems = []
    # validate_target_mode.go: an explicit root_path in the target itself, or "target
    # with 'mode: production' must set 'workspace.root_path'" (a recommendation only
    # when run_as is set, an error for a person deploying without it).
    if not (override.get("workspace") or {}).get("root_path"):
        problems.append("target with 'mode: production' must set 'workspace.root_path'")
    for name, pipeline in (view.get("resources", {}).get("pipelines") or {}).items():
        if pipeline.get("development"):
            problems.append(f"production target includes pipeline {name!r} with development")
    # run_as.go: exactly one identity.
    run_as = view.get("run_as")
    if run_as is not None:
        names = [key for key in ("user_name", "service_principal_name") if run_as.get(key)]
        if len(names) != 1:
            problems.append("run_as section must specify exactly one identity")
    identity = run_as_identity(view)
    if identity is None:
        problems.append("production target without run_as: jobs would run as the deployer")
    permissions = view.get("permissions") or []
    if not permissions:
        problems.append("production target without permissions: only the deployer could run")
    for permission in permissions:
        if sum(1 for key in PRINCIPAL_KEYS if permission.get(key)) != 1:
            problems.append(f"permission {permission}: exactly one principal expected")
    for job_name, job in (view.get("resources", {}).get("jobs") or {}).items():
        for cluster in job.get("job_clusters") or []:
            spec = cluster.get("new_cluster") or {}
            where = f"job {job_name!r} cluster {cluster.get('job_cluster_key')!r}"
            if spec.get("data_security_mode") not in DEDICATED_MODES:
                problems.append(f"{where}: not dedicated access mode (the movers use RDDs)")
            elif identity is not None and spec.get("single_user_name") != identity:
                problems.append(
                    f"{where}: dedicated cluster's single user "
                    f"{spec.get('single_user_name')!r} is not the run_as identity {identity!r}"
                )
    return problems
