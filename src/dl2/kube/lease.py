"""Leader election with a coordination.k8s.io Lease: of the dl2 schedulers of one namespace (a rollout's
two replicas, a restarted one beside a stale one), only the Lease's holder acts on a slot.

A scheduler holds the Lease while it renews it within `duration` seconds; another takes it over only once
a whole `duration` has passed since the holder's last renewal. A holder whose renewals stall (a starved
process, a slow API server) stops counting itself as holder once `duration` has passed since its last
successful renewal, before another may take over. Every write carries the object's resourceVersion, so of
two schedulers racing for an expired Lease, exactly one wins.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
import uuid

from lightkube.resources.coordination_v1 import Lease as LeaseObject

from dl2.kube.client import ApiError, Kube
from dl2.kube.resources import LEASE as NAME


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _micro(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)


class Lease:
    """The scheduler Lease of one namespace, as seen by one scheduler (`identity`)."""

    def __init__(self, kube: Kube, namespace: str, duration: float = 15.0, identity: str | None = None, name: str = NAME):
        self.kube, self.namespace, self.duration, self.name = kube, namespace, duration, name
        self.identity = identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self._held = False  # as of the last `hold()`
        self._renewed = float("-inf")  # time.monotonic() of the last successful renewal
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def keep(self, log=print) -> None:
        """Hold the Lease from a background thread, renewed three times per `duration`, so a long slot does
        not let it lapse; `held` says whether this scheduler holds it. A renewal the API refuses is logged and
        counts as not held."""
        def renew() -> None:
            while not self._stop.is_set():
                try:
                    self.hold()
                except ApiError as exc:
                    self._held = False
                    log(f"{exc}; renewing the lease again in {self.duration / 3:.1f} s")
                self._stop.wait(self.duration / 3)

        self.hold()
        self._renewer = threading.Thread(target=renew, name="dl2-lease", daemon=True)
        self._renewer.start()

    def stop(self) -> None:
        """Stop renewing and give the Lease up (a clean exit: another scheduler may take over at once)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        self.release()

    @property
    def held(self) -> bool:
        """Whether this scheduler holds the Lease: its last `hold()` got it, less than `duration` ago."""
        return self._held and time.monotonic() - self._renewed < self.duration

    def hold(self) -> bool:
        """Take or renew the Lease; True while this scheduler holds it, False while another does."""
        started = time.monotonic()  # the renewal counts from before the request: the API's view is never older
        try:
            lease = self.kube.get(LeaseObject, self.name, self.namespace)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return self._won(self._create(_now()), started)
        now = _now()  # after the read, so a slow read does not age the renewal written
        spec = lease.get("spec", {})
        holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
        expired = renewed is None or (now - _parse(renewed)).total_seconds() > spec.get("leaseDurationSeconds", self.duration)
        if holder not in (None, "", self.identity) and not expired:
            return self._won(False, started)
        spec = {**spec, "holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.duration)),
                "renewTime": _micro(now)}
        if holder != self.identity:
            spec.update(acquireTime=_micro(now), leaseTransitions=spec.get("leaseTransitions", 0) + 1)
        try:
            self.kube.replace({**lease, "spec": spec})  # carries the resourceVersion read
        except ApiError as exc:
            if exc.status == 409:  # another scheduler wrote it first
                return self._won(False, started)
            raise
        return self._won(True, started)

    def _won(self, held: bool, started: float) -> bool:
        self._held = held
        if held:
            self._renewed = started
        return held

    def release(self) -> None:
        """Give the Lease up at once if this scheduler holds it (a clean exit: another may take over now)."""
        try:
            lease = self.kube.get(LeaseObject, self.name, self.namespace)
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        if lease.get("spec", {}).get("holderIdentity") != self.identity:
            return
        self._held = False
        spec = {**lease["spec"], "holderIdentity": None, "renewTime": None}
        try:
            self.kube.replace({**lease, "spec": spec})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def _create(self, now: datetime.datetime) -> bool:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.duration)),
                         "acquireTime": _micro(now), "renewTime": _micro(now), "leaseTransitions": 0}}
        try:
            self.kube.create(body)
        except ApiError as exc:
            if exc.status == 409:  # created by another scheduler meanwhile
                return False
            raise
        return True
