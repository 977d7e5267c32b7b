"""A small Kubernetes REST client: JSON over HTTPS with a bearer token or client certificate.

Transient failures (connection errors, 429, 5xx) are retried with exponential backoff; `on_conflict`
retries a read-modify-write on 409 Conflict. Errors that remain are `ApiError`s naming the request.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from dl2.errors import Dl2Error

TRANSIENT = {429, 500, 502, 503, 504}
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
T = TypeVar("T")


class ApiError(Dl2Error):
    """A request the API server refused (or could not be reached for); `status` is the HTTP code (0: no answer)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class Connection:
    server: str
    verify: bytes | bool  # the CA bundle (PEM), True for the system's, or False: no verification
    token: str | None = None
    cert: tuple[bytes, bytes] | None = None  # client certificate and key (PEM)


def load_kubeconfig(path: str | Path) -> Connection:
    """The current context of a kubeconfig file: server, CA, and a token or client certificate."""
    path = Path(path)
    if not path.is_file():
        raise Dl2Error(f"{path}: kubeconfig not found (start a testbed with `dl2 testbed up --local`)")
    try:
        config = yaml.safe_load(path.read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    except (yaml.YAMLError, KeyError, StopIteration, TypeError) as exc:
        raise Dl2Error(f"{path}: not a usable kubeconfig ({type(exc).__name__}: {exc})") from None

    def data_or_file(entry: dict, key: str) -> bytes | None:
        """The PEM bytes of `key`, embedded (`<key>-data`) or in a file named relative to the kubeconfig."""
        if entry.get(f"{key}-data"):
            try:
                return base64.b64decode(entry[f"{key}-data"], validate=True)
            except ValueError:
                raise Dl2Error(f"{path}: {key}-data is not base64") from None
        if not entry.get(key):
            return None
        named = path.parent / entry[key]
        if not named.is_file():
            raise Dl2Error(f"{path}: {key}: {named} not found")
        return named.read_bytes()

    verify: bytes | bool = False if cluster.get("insecure-skip-tls-verify") else (data_or_file(cluster, "certificate-authority") or True)
    cert, key = data_or_file(user, "client-certificate"), data_or_file(user, "client-key")
    return Connection(cluster["server"], verify, user.get("token"), (cert, key) if cert and key else None)


def in_cluster() -> Connection:
    """The pod's service account, as a scheduler running inside the cluster sees it."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not (IN_CLUSTER / "token").is_file():
        raise Dl2Error("not running inside a Kubernetes pod: pass --kubeconfig")
    return Connection(f"https://{host}:{port}", (IN_CLUSTER / "ca.crt").read_bytes(), (IN_CLUSTER / "token").read_text().strip())


class Kube:
    """JSON requests against one API server; `retries` transient failures per request, backing off."""

    def __init__(self, conn: Connection, retries: int = 8, backoff: float = 0.05, max_backoff: float = 2.0,
                 transport: httpx.BaseTransport | None = None):
        self.conn, self.retries, self.backoff, self.max_backoff = conn, retries, backoff, max_backoff
        headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}
        self.http = httpx.Client(base_url=conn.server, verify=ssl_context(conn), headers=headers, timeout=30.0,
                                 transport=transport)
        self.retried = 0  # transient failures retried so far

    @classmethod
    def from_kubeconfig(cls, path: str | Path | None, **kwargs) -> Kube:
        return cls(load_kubeconfig(path) if path is not None else in_cluster(), **kwargs)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, body: Any = None, params: dict | None = None,
                content_type: str = "application/json", accept: str = "application/json") -> dict:
        headers = {"Content-Type": content_type, "Accept": accept}
        for attempt in range(self.retries + 1):
            try:
                response = self.http.request(method, path, json=body, params=params, headers=headers)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise ApiError(0, "Unreachable", f"{method} {self.conn.server}{path}: {exc}") from None
            else:
                if response.status_code < 400:
                    return response.json() if response.content else {}
                if response.status_code not in TRANSIENT or attempt == self.retries:
                    raise _error(method, path, response)
            self.retried += 1
            time.sleep(min(self.max_backoff, self.backoff * 2 ** attempt))
        raise AssertionError("unreachable")

    def get(self, path: str, **params) -> dict:
        return self.request("GET", path, params=params or None)

    def items(self, path: str, **params) -> list[dict]:
        return self.get(path, **params).get("items", [])

    def create(self, path: str, body: dict, dry_run: bool = False) -> dict:
        return self.request("POST", path, body, params={"dryRun": "All"} if dry_run else None)

    def replace(self, path: str, body: dict) -> dict:
        return self.request("PUT", path, body)

    def apply(self, path: str, body: dict, manager: str = "dl2", dry_run: bool = False) -> dict:
        """Server-side apply of `body` at the object's `path` (as `kubectl apply --server-side`)."""
        params = {"fieldManager": manager, "force": "true", **({"dryRun": "All"} if dry_run else {})}
        return self.request("PATCH", path, body, params=params, content_type="application/apply-patch+yaml")

    def patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, missing_ok: bool = True) -> None:
        """Delete at once (grace period 0); a missing object is fine unless `missing_ok` is False."""
        try:
            self.request("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        except ApiError as exc:
            if exc.status != 404 or not missing_ok:
                raise

    def on_conflict(self, attempt: Callable[[], T], tries: int = 10) -> T:
        """Run a read-modify-write `attempt` again (after a short backoff) while it hits 409 Conflict."""
        for k in range(tries):
            try:
                return attempt()
            except ApiError as exc:
                if exc.status != 409 or exc.reason == "AlreadyExists" or k == tries - 1:
                    raise
                self.retried += 1
                time.sleep(min(self.max_backoff, self.backoff * 2 ** k))
        raise AssertionError("unreachable")


def ssl_context(conn: Connection) -> ssl.SSLContext:
    """TLS settings for `conn`: its CA (or no verification), and its client certificate if any. `ssl` reads
    a certificate chain only from files: the key lives in a private folder just while it is loaded."""
    if conn.verify is False:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        cadata = conn.verify.decode() if isinstance(conn.verify, bytes) else None
        context = ssl.create_default_context(cadata=cadata)
    if conn.cert is not None:
        with tempfile.TemporaryDirectory(prefix="dl2-client-cert-") as scratch:  # created 0700
            cert, key = Path(scratch) / "client.crt", Path(scratch) / "client.key"
            cert.write_bytes(conn.cert[0])
            key.write_bytes(conn.cert[1])
            context.load_cert_chain(cert, key)
    return context


def _error(method: str, path: str, response: httpx.Response) -> ApiError:
    try:
        status = response.json()
        reason, message = status.get("reason", ""), status.get("message", response.text)
    except ValueError:
        reason, message = "", response.text
    return ApiError(response.status_code, reason, f"{method} {path}: {response.status_code} {reason}: {message}".strip())
