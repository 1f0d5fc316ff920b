"""Checking documents against Knative's Service CRD and Kubernetes' own schemas.

``knative_service_errors`` does what the API server would with a Knative Service: validate it
against the CRD's OpenAPI v3 schema (types, required fields, enums) and list every field the
schema does not declare, which a structural schema would silently prune (a typo'd field must
fail a test, not vanish). ``pod_template_errors`` validates the revision template as a
Kubernetes ``Pod`` with kubernetes-validate in strict mode, since the CRD leaves many PodSpec
parts (tolerations, affinity, ...) as ``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

DATA = Path(__file__).parent / "data"
KUBERNETES_VERSION = "1.33.0"
"""The Kubernetes schemas the manifests are validated against (an EKS-supported release)."""

# Fields of a RevisionSpec that a Pod does not have.
_KNATIVE_ONLY = frozenset(
    {"containerConcurrency", "timeoutSeconds", "responseStartTimeoutSeconds", "idleTimeoutSeconds"}
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@functools.cache
def knative_service_schema() -> dict[str, Any]:
    crd = yaml.safe_load((DATA / "knative-serving-service-crd.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])


def knative_service_errors(doc: dict[str, Any]) -> list[str]:
    """Why the API server would refuse ``doc`` or drop parts of it; empty when it would not."""
    schema = knative_service_schema()
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]
    errors += [f"{path}: not in the schema (would be pruned)" for path in pruned(doc, schema)]
    if doc.get("apiVersion") != "serving.knative.dev/v1" or doc.get("kind") != "Service":
        errors.append("not a serving.knative.dev/v1 Service")
    errors += metadata_errors(doc.get("metadata") or {}, "metadata")
    template_metadata = doc.get("spec", {}).get("template", {}).get("metadata", {})
    errors += metadata_errors(template_metadata, "spec.template.metadata")
    return errors


def pruned(doc: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths in ``doc`` that a structural schema does not declare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(doc, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in doc.items():
            here = f"{path}.{key}" if path else str(key)
            if path == "" and key == "metadata":
                continue  # ObjectMeta: the API server's own, checked by metadata_errors
            if properties is not None and key in properties:
                found += pruned(value, properties[key], here)
            elif isinstance(extra, dict):
                found += pruned(value, extra, here)
            elif properties is not None:
                found.append(here)
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(doc):
            found += pruned(item, schema["items"], f"{path}[{index}]")
    return found


def metadata_errors(metadata: dict[str, Any], where: str) -> list[str]:
    """Label and annotation syntax, and the name, as Kubernetes validates ObjectMeta."""
    errors = []
    name = metadata.get("name")
    if name is not None and (len(name) > 63 or not _DNS_SUBDOMAIN.match(name)):
        errors.append(f"{where}.name: '{name}' is not a valid name")
    for kind in ("labels", "annotations"):
        for key, value in (metadata.get(kind) or {}).items():
            if not _qualified_name(key):
                errors.append(f"{where}.{kind}: '{key}' is not a qualified name")
            if not isinstance(value, str):
                errors.append(f"{where}.{kind}.{key}: values are strings")
            elif kind == "labels" and (len(value) > 63 or not _LABEL_VALUE.match(value)):
                errors.append(f"{where}.labels.{key}: '{value}' is not a label value")
    return errors


def _qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_NAME_PART.match(name))


def pod_template_errors(service: dict[str, Any]) -> list[str]:
    """The Service's revision template validated as a Kubernetes Pod (strict: unknown fields
    fail)."""
    template = service["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata", {}),
        "spec": {k: v for k, v in template["spec"].items() if k not in _KNATIVE_ONLY},
    }
    return kubernetes_errors(pod)


def kubernetes_errors(doc: dict[str, Any]) -> list[str]:
    """kubernetes-validate's verdict on one built-in resource, strict; empty when valid."""
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}: {exc}"]
    return []
