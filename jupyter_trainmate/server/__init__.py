"""Jupyter server extension: authenticated REST handlers under `<base_url>/trainmate/api/`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .handlers import handlers

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

__all__ = ["load_server_extension"]


def load_server_extension(server_app: ServerApp) -> None:
    """Add the trainmate handlers to a running Jupyter server."""
    base_url = server_app.web_app.settings["base_url"]
    server_app.web_app.add_handlers(".*$", handlers(base_url))  # type: ignore[no-untyped-call]
    server_app.log.info("jupyter_trainmate server extension loaded")
