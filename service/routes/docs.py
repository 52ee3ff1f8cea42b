"""/docs (Swagger UI) and /redoc (ReDoc) with their scripts served by this server, so they work offline.

FastAPI's built-in pages load Swagger UI and ReDoc from a CDN: on an air-gapped machine /docs stays
blank. This is FastAPI's documented self-hosting recipe: the app is built with `docs_url=None,
redoc_url=None` (service/app.py) and these routes render the same pages, pointing at assets from the
`fastapi-offline` wheel (pinned in pyproject's `service` extra) under /docs-assets/. Nothing here asks
another host for anything: no validator badge, no web fonts, and a Content-Security-Policy of this
origin only, so ReDoc's "powered by" logo (an <img> from its CDN, which hides itself when it cannot
load) is never fetched.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse

from service.problems import Problem

ASSETS_DIR = files("fastapi_offline") / "static"
ASSETS_URL = "/docs-assets"
# The only files served: a name is looked up here, never joined to a path.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
# The pages' own inline start-up script and styles are allowed; nothing from another origin is.
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


def _same_origin_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CSP
    page.headers["X-Content-Type-Options"] = "nosniff"
    return page


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    root, app = _root(request), request.app
    return _same_origin_only(
        get_swagger_ui_html(
            openapi_url=root + app.openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
            # validatorUrl: Swagger UI would otherwise show a badge fetched from validator.swagger.io.
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), "validatorUrl": None},
        )
    )


@router.get(OAUTH2_REDIRECT_URL)
def swagger_ui_oauth2_redirect() -> HTMLResponse:
    return _same_origin_only(get_swagger_ui_oauth2_redirect_html())


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    root, app = _root(request), request.app
    return _same_origin_only(
        get_redoc_html(
            openapi_url=root + app.openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
    )


@router.get(ASSETS_URL + "/{name}")
def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise Problem(404, f"no such documentation asset; there are: {', '.join(sorted(ASSETS))}", field="name")
    response = FileResponse(str(ASSETS_DIR / name), media_type=ASSETS[name])
    response.headers["Cache-Control"] = "public, max-age=86400"
    return response
