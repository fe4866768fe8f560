"""Offline schema validation of deploy/k8s's documents (chapter 08), strict as `kubectl apply
--validate=strict` is: Kubernetes' own kinds against kubernetes-validate's OpenAPI schemas, the
custom resources against the openAPIV3Schema of their CRDs, vendored in tests/data/crd_schemas/
(each file's $comment names the release and commit it was taken from). A field the schema does not
declare is an error. Not checked: CEL rules (x-kubernetes-validations) and string formats."""

import functools
import json
from pathlib import Path

import jsonschema
import kubernetes_validate

SCHEMAS = Path(__file__).parent / "data" / "crd_schemas"


def _strict(node):
    """The schema with unknown fields refused wherever the CRD lists an object's fields."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str) -> tuple[str, dict]:
    """(apiVersion, strict schema) of a vendored CRD kind; KeyError when none is vendored."""
    path = SCHEMAS / f"{kind}.json"
    if not path.exists():
        raise KeyError(kind)
    doc = json.loads(path.read_text())
    schema = _strict(doc["schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: Kubernetes checks it, not the CRD
    return doc["apiVersion"], schema


def vendored() -> set[str]:
    return {p.stem for p in SCHEMAS.glob("*.json")}


def validate(doc: dict, version: str) -> None:
    """Raise when ``doc`` is not a valid object of its kind (Kubernetes ``version`` for core kinds)."""
    if doc["kind"] in vendored():
        api, schema = crd_schema(doc["kind"])
        if doc["apiVersion"] != api:
            raise jsonschema.ValidationError(f"{doc['kind']} is served as {api}, not {doc['apiVersion']}")
        jsonschema.Draft7Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)
