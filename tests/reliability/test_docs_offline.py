"""/docs is served from this server's own files (issue 11, "browsers kept out"): the page
runs in the origin the Origin guard trusts, so on main a script from cdn.jsdelivr.net
(unpinned) had full API access, and the page did not work offline. Against the real
server on loopback."""

from __future__ import annotations

import re

import httpx


def test_docs_page_loads_nothing_from_another_origin(server):
    r = httpx.get(server.root + "/docs", timeout=10)
    assert r.status_code == 200 and "SwaggerUIBundle" in r.text
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", r.text)
    urls += re.findall(r"""url:\s*["']([^"']+)""", r.text)
    assert urls, r.text[:500]
    assert all(u.startswith("/") and not u.startswith("//") for u in urls), urls
    assert "http://" not in r.text and "https://" not in r.text  # no CDN, favicon, validator
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp


def test_docs_assets_are_served_locally(server):
    page = httpx.get(server.root + "/docs", timeout=10).text
    for path, kind in (("/docs/assets/swagger-ui-bundle.js", "javascript"),
                       ("/docs/assets/swagger-ui.css", "text/css"),
                       ("/docs/assets/favicon.png", "image/png")):
        assert path in page
        r = httpx.get(server.root + path, timeout=10)
        assert r.status_code == 200 and kind in r.headers["content-type"], path
        assert len(r.content) > 100
    js = httpx.get(server.root + "/docs/assets/swagger-ui-bundle.js", timeout=10).text
    assert "SwaggerUIBundle" in js  # the real bundle (Swagger UI 5: renders OpenAPI 3.1)


def test_docs_assets_route_serves_only_its_files(server):
    for name in ("redoc.standalone.js", "..%2F__init__.py", "index.html"):
        r = httpx.get(server.root + "/docs/assets/" + name, timeout=10)
        assert r.status_code == 404, name
