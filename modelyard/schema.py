"""OpenAPI schema post-processing: every error status an operation can answer is documented for it.

drf-spectacular documents the success answers it sees in each view; the errors come from DRF and the
services, the same for every view, so they are added here by rule (``document_error_statuses``, a
``POSTPROCESSING_HOOKS`` entry):

- 401 and 403 on every operation (no or a bad token; a missing scope or role);
- 400 on operations that take a body or query parameters (validation, malformed JSON, a bad filter);
- 404 on operations with path parameters, a ``cursor`` or a body (an unknown object, also one a body
  names, or an invalid cursor);
- 409 on operations that change state (``POST``, ``PUT``, ``PATCH``, ``DELETE``);
- 413 and 415 on operations that take a body (over the size limit, an unsupported media type).

Every one of them is the error envelope of ``modelyard.api_errors``, the ``Error`` component:
``{"detail": str, "code": one of ERROR_CODES, "fields": {name: [str]}}`` (``fields`` on ``invalid``
answers only). The fuzzer checks that each answer's status is documented (``status_code_conformance`` in
``tests/fuzzing.py``), so an operation answering outside these rules fails CI.
"""

from modelyard.api_errors import ERROR_CODES

ERROR = {"$ref": "#/components/schemas/Error"}
CODE_TABLE = "| code | status | meaning |\n|---|---|---|\n" + "".join(
    f"| `{code}` | {status} | {meaning} |\n" for code, (status, meaning) in ERROR_CODES.items())
ERROR_COMPONENT = {
    "type": "object",
    "description": f"Every error answer of the API. `code` is stable: switch on it, not on `detail`.\n\n{CODE_TABLE}",
    "properties": {
        "detail": {"type": "string", "description": "What went wrong, a sentence for people"},
        "code": {"type": "string", "enum": list(ERROR_CODES), "description": "What went wrong, for programs"},
        "fields": {
            "type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}},
            "description": "On `invalid` answers only: each refused field (`config.max_batch_size`, `hosts.0`) "
                           "and its messages; empty when the request as a whole is refused",
        },
    },
    "required": ["detail", "code"],
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
    """Add the error answers each operation can give (see the module docstring); existing entries stay,
    and every one refers to the ``Error`` component.

    Args:
        result: the generated OpenAPI document (a dict), changed in place.

    Returns:
        The same document.
    """
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_COMPONENT  # over the one drf-spectacular made of modelyard.api.ErrorSerializer
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
                wanted["400"] = ERROR
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
