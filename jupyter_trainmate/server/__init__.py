"""Internal (for contributors): the Jupyter server extension: authenticated REST handlers under `<base_url>/trainmate/api/`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.status import status_dir
from .handlers import MetricsState, handlers
from .notify import Notifier, TrainmateNotify

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

__all__ = ["load_server_extension"]


def load_server_extension(server_app: ServerApp) -> None:
    """Add the trainmate handlers to a running Jupyter server."""
    web_app = server_app.web_app
    # Kernels find the runtime dir through JUPYTER_RUNTIME_DIR or the default, as the server does.
    web_app.settings["trainmate"] = MetricsState.create(
        status_dir(server_app.runtime_dir), Path(server_app.root_dir)
    )
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))  # type: ignore[no-untyped-call]
    notifier = Notifier(
        TrainmateNotify(parent=server_app),
        web_app.settings["trainmate"].runs_dir,
        server_app.log,
    )
    web_app.settings["trainmate_notifier"] = notifier
    notifier.start()  # only with a webhook URL
    server_app.log.info("jupyter_trainmate server extension loaded")
