"""OpenAPI schema post-processing: every error status an operation can answer is documented for it.

drf-spectacular documents the success answers it sees in each view; the errors come from DRF and the
services, the same for every view, so they are added here by rule (``document_error_statuses``, a
``POSTPROCESSING_HOOKS`` entry):

- 401 and 403 on every operation (no or a bad token; a missing scope or role);
- 400 on operations that take a body or query parameters (validation, malformed JSON, a bad filter),
  with DRF's shapes: ``{"detail": ...}`` or ``{"<field>": ["message", ...]}``;
- 404 on operations with path parameters, a ``cursor`` or a body (an unknown object, also one a body
  names, or an invalid cursor);
- 409 on operations that change state (``POST``, ``PUT``, ``PATCH``, ``DELETE``);
- 413 and 415 on operations that take a body (over the size limit, an unsupported media type).

The fuzzer checks that each answer's status is documented (``status_code_conformance`` in
``tests/fuzzing.py``), so an operation answering outside these rules fails CI.
"""

ERROR = {"$ref": "#/components/schemas/Error"}
ERROR_COMPONENT = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
VALIDATION_ERROR_COMPONENT = {
    "type": "object",
    "description": "`{\"detail\": message}`, or per-field messages: `{\"<field>\": [\"message\", ...]}`",
    "additionalProperties": {},
}
DESCRIPTIONS = {
    "400": "The request is malformed or a value is invalid",
    "401": "No valid API token",
    "403": "The token's scopes or the user's role do not allow this",
    "404": "No such object (or one of another team), also one the body names, or an invalid cursor",
    "409": "The change conflicts with the current state",
    "413": "The request body is over the size limit",
    "415": "The request body's media type is not accepted",
}
WRITE_METHODS = {"post", "put", "patch", "delete"}


def _error(status: str, schema: dict) -> dict:
    return {"description": DESCRIPTIONS[status], "content": {"application/json": {"schema": schema}}}


def document_error_statuses(result: dict, generator, request, public) -> dict:
    """Add the error answers each operation can give (see the module docstring); existing entries stay.

    Args:
        result: the generated OpenAPI document (a dict), changed in place.

    Returns:
        The same document.
    """
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault("Error", ERROR_COMPONENT)
    components.setdefault("ValidationError", VALIDATION_ERROR_COMPONENT)
    validation = {"$ref": "#/components/schemas/ValidationError"}
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            parameters = operation.get("parameters", [])
            has_query = any(p.get("in") == "query" for p in parameters)
            has_path = "{" in path
            has_cursor = any(p.get("name") == "cursor" for p in parameters)
            has_body = "requestBody" in operation
            wanted = {"401": ERROR, "403": ERROR}
            if has_body or has_query:
                wanted["400"] = validation
            if has_path or has_cursor or has_body:
                wanted["404"] = ERROR
            if method in WRITE_METHODS:
                wanted["409"] = ERROR
            if has_body:
                wanted.update({"413": ERROR, "415": ERROR})
            responses = operation["responses"]
            for status, schema in wanted.items():
                responses.setdefault(status, _error(status, schema))
    return result
