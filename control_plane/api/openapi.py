"""The admin API's OpenAPI 3.1 document, generated from the pydantic schemas."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from control_plane.api import keys, schemas

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{model}"

_ERRORS = {
    "400": "Malformed JSON",
    "401": "Missing or wrong admin token",
    "404": "No such model (or key)",
    "409": "The model exists already, or changed meanwhile",
    "422": "A field fails validation (`fields` names it), or the stored model is one no "
    "worker could load (the worker's words for it)",
    "424": "The model's load failed for good; `zeroserve models load` tries it again",
    "502": "A worker failed the load",
    "503": "Not possible now (no capacity, not acting, timeout, storage unreachable); see "
    "Retry-After",
}


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _operation(
    summary: str,
    responses: dict[str, dict[str, Any]],
    *,
    body: type[BaseModel] | None = None,
    errors: tuple[str, ...] = ("401",),
    name_param: bool = False,
    dry_run: bool = False,
    key_param: bool = False,
) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": dict(responses)}
    for status in errors:
        operation["responses"][status] = _json(schemas.ErrorBody, _ERRORS[status])
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(body)}},
        }
    parameters: list[dict[str, Any]] = []
    if name_param:
        parameters.append(
            {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
        )
    if dry_run:
        parameters.append(
            {
                "name": "dry_run",
                "in": "query",
                "required": False,
                "description": "Check the stored model and answer the view; change nothing",
                "schema": {"type": "boolean", "default": False},
            }
        )
    if key_param:
        parameters.append(
            {"name": "key_id", "in": "path", "required": True, "schema": {"type": "string"}}
        )
    if parameters:
        operation["parameters"] = parameters
    return operation


def openapi_document() -> dict[str, Any]:
    """The document served at ``/admin/v1/openapi.json``."""
    _, defs = models_json_schema(
        [
            (schemas.ModelCreate, "validation"),
            (schemas.ModelPatch, "validation"),
            (schemas.ModelView, "serialization"),
            (schemas.ModelList, "serialization"),
            (schemas.Activations, "serialization"),
            (schemas.UsageView, "serialization"),
            (schemas.WorkerList, "serialization"),
            (schemas.ErrorBody, "serialization"),
            (keys.KeyCreate, "validation"),
            (keys.KeyCreated, "serialization"),
            (keys.KeyView, "serialization"),
            (keys.KeyList, "serialization"),
        ],
        ref_template=_REF,
    )
    view = _json(schemas.ModelView, "The model and its status")
    item = ("401", "404")
    acting = ("401", "404", "503")
    paths: dict[str, Any] = {
        "/admin/v1/models": {
            "get": _operation(
                "List registered models", {"200": _json(schemas.ModelList, "Every model")}
            ),
            "post": _operation(
                "Register a model (its stored model is checked first)",
                {
                    "201": _json(schemas.ModelView, "Registered"),
                    "200": _json(schemas.ModelView, "dry_run: it would be registered"),
                },
                body=schemas.ModelCreate,
                errors=("400", "401", "409", "422", "503"),
                dry_run=True,
            ),
        },
        "/admin/v1/models/{name}": {
            "get": _operation(
                "A model and its status", {"200": view}, errors=item, name_param=True
            ),
            "patch": _operation(
                "Change a model (a storage or config change reloads its replicas)",
                {"200": view},
                body=schemas.ModelPatch,
                errors=("400", "401", "404", "409", "422", "503"),
                name_param=True,
                dry_run=True,
            ),
            "delete": _operation(
                "Unload a model everywhere and forget it",
                {"204": {"description": "Deleted"}},
                errors=acting,
                name_param=True,
            ),
        },
        "/admin/v1/models/{name}/load": {
            "post": _operation(
                "Load a model now (waits until a replica is ready)",
                {
                    "200": view,
                    "202": _json(schemas.ModelView, "Passed on to the acting control plane"),
                },
                errors=("401", "404", "424", "502", "503"),
                name_param=True,
            )
        },
        "/admin/v1/models/{name}/unload": {
            "post": _operation(
                "Unload every replica of a model", {"200": view}, errors=acting, name_param=True
            )
        },
        "/admin/v1/models/{name}/activations": {
            "get": {
                **_operation(
                    "The newest cold-start timelines of a model; with follow=true, "
                    "server-sent events of the activations in course",
                    {
                        "200": {
                            "description": "Newest first; with follow=true, a text/event-stream "
                            "of 'activation' events (one timeline each, at every change) ending "
                            "with an 'end' event once the activations followed have finished",
                            "content": {
                                **_json(schemas.Activations, "")["content"],
                                "text/event-stream": {"schema": {"type": "string"}},
                            },
                        }
                    },
                    errors=item,
                    name_param=True,
                ),
                "parameters": [
                    *_operation("", {}, name_param=True)["parameters"],
                    {
                        "name": "follow",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "boolean", "default": False},
                        "description": "Stream the activations as they run (server-sent events)",
                    },
                    {
                        "name": "wait_s",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "number", "default": 30},
                        "description": "With follow: how long to wait for an activation to "
                        "start when none is running",
                    },
                ],
            }
        },
        "/admin/v1/models/{name}/usage": {
            "get": _operation(
                "What a model cost over a time range (query start, end: seconds since the "
                "epoch; default the last 24 hours; hourly resolution)",
                {"200": _json(schemas.UsageView, "Replica-seconds and cold starts")},
                errors=(*item, "422"),
                name_param=True,
            )
        },
        "/admin/v1/workers": {
            "get": _operation(
                "Runtime workers and their models",
                {"200": _json(schemas.WorkerList, "Every worker")},
            )
        },
        "/admin/v1/keys": {
            "get": _operation(
                "List API keys (never their secrets)",
                {"200": _json(keys.KeyList, "Every key, revoked ones included")},
            ),
            "post": _operation(
                "Create an API key for the model endpoints",
                {"201": _json(keys.KeyCreated, "Created; the key is shown this once")},
                body=keys.KeyCreate,
                errors=("400", "401", "422"),
            ),
        },
        "/admin/v1/keys/{key_id}": {
            "get": _operation(
                "An API key (without its secret)",
                {"200": _json(keys.KeyView, "The key")},
                errors=item,
                key_param=True,
            )
        },
        "/admin/v1/keys/{key_id}/revoke": {
            "post": _operation(
                "Revoke an API key (every activator refuses it within a second)",
                {"200": _json(keys.KeyView, "Revoked")},
                errors=item,
                key_param=True,
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "zeroserve admin API",
            "version": "1",
            "description": (
                "Register models, control their replicas, read cold-start timelines, "
                "manage API keys."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
