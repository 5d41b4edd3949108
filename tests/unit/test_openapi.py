"""The hand-written OpenAPI document: well formed (OpenAPI 3.0 structure, every $ref
resolves, every path parameter declared) and complete (every route of the server is
documented, nothing else is)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis
from aiohttp import web

from ragwatch.config import Settings
from ragwatch.console.openapi import spec
from ragwatch.console.serve import ALERTS_MAX, INDEX_MAX, build_app
from ragwatch.store import SERIES_POINTS

DOC = spec(series_points=SERIES_POINTS, index_max=INDEX_MAX, alerts_max=ALERTS_MAX)
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def routes() -> set[tuple[str, str]]:
    """(path as OpenAPI writes it, method) of every route the server answers."""
    app = build_app(Settings(), redis.Redis())  # connects lazily: nothing is contacted
    out = set()
    for resource in app.router.resources():
        path = resource.canonical
        if isinstance(resource, web.StaticResource):
            path += "/{path}"
        for route in resource:
            if route.method != "HEAD":  # aiohttp adds HEAD to every GET
                out.add((path, route.method.lower()))
    return out


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in refs(v)]
    return []


def test_every_route_is_documented_and_every_documented_path_exists() -> None:
    documented = {(p, m) for p, item in DOC["paths"].items() for m in item}
    assert documented == routes()


def test_document_structure() -> None:
    assert re.fullmatch(r"3\.0\.\d+", DOC["openapi"])
    assert DOC["info"]["title"] and DOC["info"]["version"]
    schemes = DOC["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    assert DOC["security"] == [{"bearerAuth": []}]
    for path, item in DOC["paths"].items():
        assert path.startswith("/")
        assert set(item) <= METHODS, path
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            assert op["summary"], where
            assert op["responses"] and all(re.fullmatch(r"[1-5]\d\d", c) for c in op["responses"])
            for code, resp in op["responses"].items():
                assert resp["description"], f"{where} {code}"
                for media in resp.get("content", {}).values():
                    assert "schema" in media, f"{where} {code}"
            params = op.get("parameters", [])
            for p in params:
                assert p["in"] in ("query", "path", "header") and p["name"] and "schema" in p
                assert p["in"] != "path" or p["required"] is True
            declared = {p["name"] for p in params if p["in"] == "path"}
            assert declared == set(re.findall(r"{(\w+)}", path)), where
            if any(p["in"] == "query" for p in params):
                assert "400" in op["responses"], where
            public = op.get("security") == []
            assert public == (path in ("/", "/healthz", "/readyz", "/livez", "/static/{path}")), (
                where
            )
            assert public or "401" in op["responses"], where


@pytest.mark.parametrize("ref", sorted(set(refs(DOC))))
def test_every_ref_resolves(ref: str) -> None:
    assert ref.startswith("#/")
    node: Any = DOC
    for part in ref[2:].split("/"):
        node = node[part]
    assert isinstance(node, dict) and ("type" in node or "allOf" in node)


def test_every_schema_is_used() -> None:
    used = {r.rsplit("/", 1)[1] for r in refs(DOC)}
    assert set(DOC["components"]["schemas"]) == used
