"""A REST request to a test node's management port, as a client with a form body sends it."""
from __future__ import annotations

import base64
import urllib.error
import urllib.parse
import urllib.request

ADMIN = ("Administrator", "password")


def rest_request(node, method: str, path: str, form: dict | None = None, *,
                 auth: tuple[str, str] = ADMIN, timeout: float = 30) -> tuple[int, bytes]:
    """(status, body bytes) of `method path` on `node`'s REST port, with Basic `auth` and
    `form` (urlencoded) as the body; an HTTP error status is returned, not raised."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{node.rest_port}{path}", data=data,
                                 method=method)
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    if data is not None:
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as rsp:
            return rsp.status, rsp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()
