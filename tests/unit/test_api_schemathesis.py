"""Schemathesis against the served OpenAPI document: every operation, generated requests, no 5xx.

A live server on the fake backend (uvicorn in a thread, 127.0.0.1); requests follow the document's
schemas (positive data) and break them (negative data), a bounded number per operation, with a fixed
seed so CI runs the same cases every time. Raise SCHEMATHESIS_EXAMPLES for a longer hunt. The OpenAI-
compatible routes, /health and /metrics; not the model-management routes (side effects on disk).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from tests.ui.web_app import LiveApp, live_app

EXAMPLES_PER_OPERATION = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApp]:
    with live_app(tmp_path_factory.mktemp("schemathesis"), ui=False, max_gen_tokens=64) as app:
        yield app


def _run_operation(operation: Any, url: str, mode: GenerationMode) -> tuple[int, list[str]]:
    failures: list[str] = []
    calls = 0

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=os.environ.get("SCHEMATHESIS_EXAMPLES") is None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        nonlocal calls
        calls += 1
        response = case.call(base_url=url, timeout=60)
        if response.status_code >= 500:
            failures.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
            )
        else:
            case.validate_response(response, checks=[not_a_server_error])

    try:
        check()
    except Unsatisfiable:  # negative data for an operation without inputs (GET /v1/models): nothing to break
        assert mode == GenerationMode.NEGATIVE
    return calls, failures


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_no_generated_request_gets_a_server_error(live: LiveApp) -> None:
    schema = schemathesis.openapi.from_url(live.url + "/openapi.json")
    # NOTE: the model-management routes (/api/models...) download, load, unload and delete models: fuzzing
    # them needs a fake hub and a throw-away HF cache, which this test does not set up.
    operations = [
        op
        for op in (result.ok() for result in schema.get_all_operations())
        if not op.path.startswith("/api/")
    ]
    paths = {(op.method.upper(), op.path) for op in operations}
    assert {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models/{model_id}"),
    } <= paths
    total, failures = 0, []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            calls, found = _run_operation(operation, live.url, mode)
            total += calls
            failures += found
    print(f"schemathesis: {len(operations)} operations, {total} requests, {len(failures)} server errors")
    assert not failures, "\n".join(failures[:10])
    assert live.ctx.engine.engine.block_manager.num_used_blocks == 0  # and nothing leaked


def test_the_post_routes_document_their_json_bodies(live: LiveApp) -> None:
    import httpx

    doc = httpx.get(live.url + "/openapi.json").json()
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    assert body["required"] == ["messages"] and "temperature" in body["properties"]
    messages = body["properties"]["messages"]
    assert messages["type"] == "array" and messages["items"]["required"] == ["role"]
    for path, field in (
        ("/v1/completions", "prompt"),
        ("/v1/responses", "input"),
        ("/v1/embeddings", "input"),
    ):
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert field in schema["properties"], path
    error = doc["paths"]["/v1/models/{model_id}"]["get"]["responses"]["default"]["content"]
    assert error["application/json"]["schema"]["required"] == ["error"]
