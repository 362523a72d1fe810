"""REST handlers. Every one is `@tornado.web.authenticated`: no token, no answer (403)."""

from __future__ import annotations

import json

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .._version import __version__

NAMESPACE = "trainmate/api"


class VersionHandler(APIHandler):
    """`GET /trainmate/api/version`: which jupyter_trainmate the server runs."""

    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(json.dumps({"name": "jupyter_trainmate", "version": __version__}))


def handlers(base_url: str) -> list[tuple[str, type[APIHandler]]]:
    """The URL patterns of the extension under the server's `base_url`."""
    return [(url_path_join(base_url, NAMESPACE, "version"), VersionHandler)]
