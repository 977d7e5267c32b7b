"""Talking to the Kubernetes API, through lightkube.

lightkube reads a kubeconfig as kubectl does (contexts, client certificates, bearer tokens, exec
credential plugins, proxies from the environment) and runs inside a pod as its service account (rotating
tokens). dl2 keeps the objects it reads and writes as plain dicts, the API's own JSON, and adds what its
scheduler relies on: transient failures (connection errors, 429, 5xx) are retried with exponential
backoff, and `on_conflict` reruns a read-modify-write on 409 Conflict. Errors that remain are `ApiError`s
naming the request.

Why lightkube rather than the official `kubernetes` package: it is small, typed and kept current with
Kubernetes releases (its models are generated per minor version), its resources cover custom resources
and subresources (a DL2Job's status, a pod's binding, a service account's token), it watches, and it
is built on httpx2, whose transports let the fault tests put answers the real server will not give on
demand (503, 429) between dl2 and a real API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import lightkube
import msgspec
from lightkube import codecs, operators
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ConfigError
from lightkube.core.resource import Resource
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import PodBinding, ServiceAccountToken
from lightkube.types import PatchType

from dl2.errors import Dl2Error

TRANSIENT = {429, 500, 502, 503, 504}
MANAGER = "dl2"  # the field manager of dl2's server-side applies
T = TypeVar("T")


class ApiError(Dl2Error):
    """A request the API server refused (or could not be reached for); `status` is the HTTP code (0: no answer)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


def load_config(kubeconfig: str | Path | None, context: str | None = None) -> SingleConfig:
    """A kubeconfig file's context (its current one by default), or, with no file, the pod's service account."""
    try:
        if kubeconfig is None:
            return KubeConfig.from_service_account().get()
        path = Path(kubeconfig)
        if not path.is_file():
            raise Dl2Error(f"{path}: kubeconfig not found (start a testbed with `dl2 testbed up --local`)")
        config = KubeConfig.from_file(path).get(context)
    except ConfigError as exc:
        where = kubeconfig or "the pod's service account"
        raise Dl2Error(f"{where}: not a usable kubeconfig ({exc})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Dl2Error(f"{kubeconfig}: not a usable kubeconfig ({type(exc).__name__}: {exc})") from None
    if config is None:
        raise Dl2Error(f"{kubeconfig}: no context {context!r} in this kubeconfig" if context else f"{kubeconfig}: no current context")
    _check_files(config, kubeconfig or "the pod's service account")
    return config


def _check_files(config: SingleConfig, where: str | Path) -> None:
    """Every file the context names exists (lightkube would fail later, without saying which)."""
    user = config.user
    named = {"certificate-authority": config.cluster.certificate_auth,
             "client-certificate": user and user.client_cert, "client-key": user and user.client_key,
             "tokenFile": user and user.token_file}
    for key, name in named.items():
        if name and not Path(config.abs_file(name)).is_file():
            raise Dl2Error(f"{where}: {key}: {config.abs_file(name)} not found")


Kind = type[Resource]  # a lightkube resource: Pod, Node, ConfigMap, Lease, DL2Job, DL2Job.Status, ...


class Kube:
    """Requests against one API server; `retries` transient failures per request, backing off."""

    def __init__(self, config: SingleConfig, retries: int = 8, backoff: float = 0.05, max_backoff: float = 2.0,
                 transport: httpx2.BaseTransport | None = None):
        self.config, self.retries, self.backoff, self.max_backoff = config, retries, backoff, max_backoff
        self.client = lightkube.Client(config, lazy=False, field_manager=MANAGER, transport=transport,
                                       timeout=httpx2.Timeout(30.0))
        self.retried = 0  # transient failures retried so far

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path | None, context: str | None = None, **kwargs) -> Kube:
        """A client for `kubeconfig` (None: the pod's service account, in the cluster)."""
        return cls(load_config(kubeconfig, context), **kwargs)

    @property
    def server(self) -> str:
        return self.config.cluster.server

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Kube:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict:
        return self._call(f"GET {_what(kind, name, namespace)}", lambda: self.client.get(kind, name, namespace=namespace))

    def list(self, kind: Kind, namespace: str | None = None, labels: Mapping[str, Any] | None = None) -> list[dict]:
        """Every object of `kind` (in `namespace`) whose labels match `labels` ({key: value}, or {key: None}:
        the label is set)."""
        selector = {k: operators.exists() if v is None else v for k, v in (labels or {}).items()} or None
        return self._call(f"LIST {_what(kind, None, namespace)}",
                          lambda: list(self.client.list(kind, namespace=namespace, labels=selector)))

    def create(self, obj: dict, dry_run: bool = False) -> dict:
        res = codecs.from_dict(obj)
        return self._call(f"CREATE {_describe(obj)}", lambda: self.client.create(res, dry_run=dry_run))

    def replace(self, obj: dict) -> dict:
        """Replace the object; its metadata's resourceVersion makes the write conditional (409 when stale)."""
        res = codecs.from_dict(obj)
        return self._call(f"REPLACE {_describe(obj)}", lambda: self.client.replace(res))

    def apply(self, obj: dict, dry_run: bool = False) -> dict:
        """Server-side apply (as `kubectl apply --server-side --force-conflicts`)."""
        res = codecs.from_dict(obj)
        return self._call(f"APPLY {_describe(obj)}", lambda: self.client.apply(res, force=True, dry_run=dry_run))

    def patch(self, kind: Kind, name: str, patch: dict, namespace: str | None = None) -> dict:
        """A JSON merge patch (a `kind` may be a subresource, such as `DL2Job.Status`)."""
        return self._call(f"PATCH {_what(kind, name, namespace)}", lambda: self.client.patch(
            kind, name, patch, namespace=namespace, patch_type=PatchType.MERGE))

    def delete(self, kind: Kind, name: str, namespace: str | None = None, missing_ok: bool = True,
               grace_seconds: int = 0) -> None:
        """Delete, at once by default (a pod may be given `grace_seconds` to stop after its SIGTERM); a missing
        object is fine unless `missing_ok` is False."""
        try:
            self._call(f"DELETE {_what(kind, name, namespace)}",
                       lambda: self.client.delete(kind, name, namespace=namespace, grace_period=grace_seconds))
        except ApiError as exc:
            if exc.status != 404 or not missing_ok:
                raise

    def bind(self, pod: str, node: str, namespace: str) -> None:
        """Bind a pod to a node through the Binding API (what a scheduler does)."""
        binding = PodBinding(metadata=ObjectMeta(name=pod), target=ObjectReference(apiVersion="v1", kind="Node", name=node))

        def request() -> None:
            try:
                self.client.create(binding, pod, namespace=namespace)
            except msgspec.ValidationError:
                pass  # the server answers a binding with a Status, which lightkube decodes as a Binding: errors come before

        self._call(f"BIND pod {namespace}/{pod} to {node}", request)

    def token(self, service_account: str, namespace: str, seconds: int = 3600) -> str:
        """A bearer token for a service account, from the TokenRequest API (valid for `seconds`)."""
        request = ServiceAccountToken(metadata=ObjectMeta(name=service_account, namespace=namespace),
                                      spec=TokenRequestSpec(expirationSeconds=seconds))
        answer = self._call(f"TOKEN for serviceaccount {namespace}/{service_account}",
                            lambda: self.client.create(request, service_account, namespace=namespace))
        return answer["status"]["token"]

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

    def _call(self, what: str, request: Callable[[], Any]) -> Any:
        """`request()`'s answer as plain dicts, transient failures retried; what remains, as an `ApiError`."""
        for attempt in range(self.retries + 1):
            try:
                answer = request()
            except httpx2.TransportError as exc:
                if attempt == self.retries:
                    raise ApiError(0, "Unreachable", f"{what} at {self.server}: {exc}") from None
            except lightkube.ApiError as exc:
                code = exc.response.status_code if exc.response is not None else exc.status.code or 0
                if code not in TRANSIENT or attempt == self.retries:
                    reason, message = exc.status.reason or "", exc.status.message or ""
                    raise ApiError(code, reason, f"{what}: {code} {reason}: {message}".rstrip(": ")) from None
            else:
                if isinstance(answer, list):
                    return [item.to_dict() for item in answer]
                return answer.to_dict() if answer is not None else {}
            self.retried += 1
            time.sleep(min(self.max_backoff, self.backoff * 2 ** attempt))
        raise AssertionError("unreachable")


def _what(kind: Kind, name: str | None, namespace: str | None) -> str:
    where = f"{namespace}/" if namespace else ""
    return f"{kind.__name__} {where}{name or ''}".rstrip("/ ")


def _describe(obj: dict) -> str:
    meta = obj.get("metadata", {})
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {where}{meta.get('name', '')}"
