"""``GET /openapi.json``: every route with its request and reply models, behind the key."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.serving.routes import protocol
from qgmem.serving.server import create_app

from .server_helpers import running
from .test_server import _service, pipeline  # noqa: F401  (fixture)

#: (method, path) -> (request model or None, reply model or None)
MODELS = {
    ("post", "/v1/users/{user_id}/sessions"): (protocol.Session, protocol.Appended),
    ("post", "/v1/users/{user_id}/sessions/batch"): (protocol.Batch, protocol.BatchAppended),
    ("post", "/v1/users/{user_id}/answer"): (protocol.AnswerRequest, protocol.AnswerResult),
    ("post", "/v1/users/{user_id}/search"): (protocol.SearchRequest, protocol.SearchResult),
    ("get", "/v1/users/{user_id}/memories"): (None, protocol.Memories),
    ("delete", "/v1/users/{user_id}/memories/{unit_id}"): (None, protocol.Forgotten),
    ("get", "/v1/users/{user_id}/export"): (None, protocol.ExportDocument),
    ("post", "/v1/users/{user_id}/import"): (protocol.ExportDocument, protocol.Imported),
    ("delete", "/v1/users/{user_id}"): (None, protocol.Deleted),
    ("post", "/v1/chat/completions"): (protocol.ChatRequest, protocol.ChatCompletion),
    ("get", "/v1/models"): (None, protocol.ModelList),
    ("get", "/v1/models/{model_id}"): (None, protocol.ModelCard),
    ("get", "/healthz"): (None, protocol.Health),
    ("get", "/metrics"): (None, None),
}


def test_the_schema_lists_every_route_with_its_models_behind_the_key(pipeline, tmp_path):  # noqa: F811
    from qgmem.serving.routes import chat, operations, users

    service = _service(pipeline, tmp_path)
    app = create_app(service, api_key="k3y")
    served = {(m.lower(), r.path.replace(":path}", "}")) for module in (users, chat, operations)
              for r in module.router(service).routes for m in r.methods if m not in ("HEAD", "OPTIONS")}
    assert served == set(MODELS)  # a new route fails here until it is given its models
    with running(app) as url:
        assert httpx.get(f"{url}/openapi.json").status_code == 401
        r = httpx.get(f"{url}/openapi.json", headers={"Authorization": "Bearer k3y"})
    assert r.status_code == 200, r.text
    schema = r.json()
    components = schema["components"]["schemas"]
    for (method, path), (body, reply) in MODELS.items():
        operation = schema["paths"][path][method]
        if body is not None:
            ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{body.__name__}"
            assert set(components[body.__name__]["properties"]) == set(body.model_fields)
        if reply is not None:
            ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{reply.__name__}", (path, ref)
            assert set(components[reply.__name__]["properties"]) == set(reply.model_fields)
        if path.startswith("/v1/users"):
            error = operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
            assert error == "#/components/schemas/ErrorBody"
    turn = components["Turn"]
    assert set(turn["required"]) == {"speaker", "text"} and turn["additionalProperties"] is False
