"""The page (docs/page.md): a browser client of the OpenAI-compatible door's stream, served at
/ui/ on the HTTP listener when RAGSERVE_PAGE_ENABLED is set. `page_routes` gives its routes; the
HTTP app puts them beside the doors' own."""

from ragserve.server.page.routes import PREFIX, page_routes

__all__ = ["PREFIX", "page_routes"]
