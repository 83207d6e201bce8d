"""A minimal OpenID Connect provider for tests, on a free loopback port: discovery, an
authorization endpoint that signs one user in at once (no consent page), a token endpoint
that checks the client and the code and returns an RS256-signed ID token carrying the
request's nonce, the JWKS, and userinfo. Enough for Streamlit's ``st.login`` (Authlib) to
run its real authorization-code flow against it; nothing here is a production provider."""

from __future__ import annotations

import base64
import secrets
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from joserfc import jwt
from joserfc.jwk import RSAKey

from app.kafka.broker import free_port


@dataclass
class Provider:
    """The running provider: its issuer URL, its client, the user it signs in, and what it saw."""

    issuer: str
    client_id: str
    client_secret: str
    claims: dict[str, Any]
    key: RSAKey
    #: code -> (redirect_uri, nonce), for the token endpoint
    codes: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: the ID tokens issued
    issued: list[str] = field(default_factory=list)
    #: requests refused, with why
    refused: list[str] = field(default_factory=list)

    @property
    def metadata_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["openid", "email", "profile"],
        }

    def id_token(self, nonce: str) -> str:
        now = int(time.time())
        claims = {**self.claims, "iss": self.issuer, "aud": self.client_id, "iat": now, "exp": now + 300}
        if nonce:
            claims["nonce"] = nonce
        token = jwt.encode({"alg": "RS256", "kid": self.key.kid}, claims, self.key)
        self.issued.append(token)
        return token


class _Handler(BaseHTTPRequestHandler):
    provider: Provider

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, body: dict[str, Any], status: int = 200) -> None:
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        p = self.provider
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/.well-known/openid-configuration":
            self._json(p.metadata())
        elif url.path == "/jwks":
            self._json({"keys": [p.key.as_dict(private=False)]})
        elif url.path == "/authorize":
            if query.get("client_id") != p.client_id or query.get("response_type") != "code":
                p.refused.append(f"authorize: {query}")
                self._json({"error": "invalid_request"}, 400)
                return
            code = secrets.token_urlsafe(16)
            p.codes[code] = (query.get("redirect_uri", ""), query.get("nonce", ""))
            back = {"code": code, "state": query.get("state", "")}
            self.send_response(302)
            self.send_header("Location", f"{query.get('redirect_uri', '')}?{urllib.parse.urlencode(back)}")
            self.end_headers()
        elif url.path == "/userinfo":
            self._json(p.claims)
        else:
            self._json({"error": "not_found"}, 404)

    def do_POST(self) -> None:
        p = self.provider
        if urllib.parse.urlsplit(self.path).path != "/token":
            self._json({"error": "not_found"}, 404)
            return
        length = int(self.headers.get("Content-Length") or 0)
        form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
        client = (form.get("client_id", ""), form.get("client_secret", ""))
        basic = self.headers.get("Authorization", "")
        if basic.startswith("Basic "):
            user, _, password = base64.b64decode(basic[6:]).decode().partition(":")
            client = (urllib.parse.unquote(user), urllib.parse.unquote(password))
        grant = p.codes.pop(form.get("code", ""), None)
        if client != (p.client_id, p.client_secret) or grant is None or grant[0] != form.get("redirect_uri"):
            p.refused.append(f"token: client {client[0]!r}, code known {grant is not None}")
            self._json({"error": "invalid_grant"}, 400)
            return
        self._json({
            "access_token": secrets.token_urlsafe(16),
            "token_type": "Bearer",
            "expires_in": 300,
            "scope": "openid email profile",
            "id_token": p.id_token(grant[1]),
        })  # fmt: skip


@contextmanager
def oidc_provider(claims: dict[str, Any], client_id: str = "console") -> Iterator[Provider]:
    """Run a provider that signs in the user ``claims`` describes; stopped on exit."""
    port = free_port()
    provider = Provider(
        issuer=f"http://127.0.0.1:{port}",
        client_id=client_id,
        client_secret=secrets.token_urlsafe(16),
        claims=claims,
        key=RSAKey.generate_key(2048, parameters={"kid": "test-key", "use": "sig", "alg": "RS256"}),
    )
    handler = type("Handler", (_Handler,), {"provider": provider})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, name="oidc-provider", daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
