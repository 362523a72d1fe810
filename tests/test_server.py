"""The server extension through pytest-jupyter's real Jupyter server, authentication on."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

import jupyter_trainmate

Fetch = Callable[..., Awaitable[Any]]


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_trainmate": True}}}


async def test_version_with_token(jp_fetch: Fetch) -> None:
    response = await jp_fetch("trainmate", "api", "version")
    assert response.code == 200
    assert json.loads(response.body) == {
        "name": "jupyter_trainmate",
        "version": jupyter_trainmate.__version__,
    }


async def test_version_without_token_is_403(
    jp_http_port: int, jp_base_url: str, jp_fetch: Fetch
) -> None:
    await jp_fetch("api", "status")  # the server is up
    url = f"http://localhost:{jp_http_port}{jp_base_url}trainmate/api/version"
    with pytest.raises(HTTPClientError) as exc:
        await AsyncHTTPClient().fetch(url)
    assert exc.value.code == 403
