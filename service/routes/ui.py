"""The dashboard: our own static HTML/CSS/JS under /ui, and `/` sends a browser there.

The files are public (no data in them); the pages call the /v1 API with the key the user typed,
which the browser keeps in localStorage. The Content-Security-Policy allows scripts, styles and
connections to this origin only, so an injected string could not run code and read that key.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles

UI_DIR = Path(__file__).resolve().parents[1] / "ui"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

router = APIRouter(include_in_schema=False)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


class DashboardFiles(StaticFiles):
    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response


def mount(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui", DashboardFiles(directory=UI_DIR, html=True), name="ui")
