"""Transitional: the page (ragserve/server/page/, not yet committed) still imports the HTTP error
table from here; it lives in server/http/errors.py now. Not part of the tree: remove once the page
imports ragserve.server.http.errors."""

from ragserve.server.http.errors import http_error, json_response

__all__ = ["http_error", "json_response"]
