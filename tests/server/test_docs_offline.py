"""/docs and /redoc work without internet: every script, stylesheet and icon the
pages load is served by the app itself (no CDN), on a real uvicorn server."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlparse

import httpx
import pytest


class _Links(HTMLParser):
    """The URLs a page makes the browser load: src= of scripts and images, href= of links."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and (name == "src" or (name == "href" and tag == "link")):
                self.urls.append(value)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(live_server, tmp_path, page: str) -> None:
    server = live_server(f"sqlite:///{tmp_path / 'ws-tune.db'}")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.get(page)
        assert response.status_code == 200
        html = response.text
        links = _Links()
        links.feed(html)
        assert len(links.urls) >= 2, html  # the script and the icon at least
        # Nothing in the page names another host: not in tags, not in the inline script.
        assert not re.findall(r"https?://[^\s\"'<>]+", html), html
        for url in links.urls:
            absolute = urljoin(server.url + page, url)
            assert urlparse(absolute).netloc == urlparse(server.url).netloc, url
            asset = client.get(absolute)
            assert asset.status_code == 200, url
            assert len(asset.content) > 1000, url  # the real bundle, not an empty stub
        # And the spec the page renders is served too.
        assert client.get("/openapi.json").json()["info"]["title"] == "ws-tune"
