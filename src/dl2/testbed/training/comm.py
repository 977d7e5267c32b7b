"""The wire between a job's processes: rendezvous, message layout and the point-to-point primitives (gloo).

One world per configuration: ranks 0..P-1 are the PS, ranks P..P+W-1 the workers. The rendezvous is a
`FileStore` in `<state>/rendezvous/g<G>-p<P>-w<W>`, so processes of another generation (or of another
shape) can never meet this one's. An elastic job's processes first agree on the same store whether the world
forms at all (`agree`): it does once all have arrived, and does not if the job's plan moves past it first (an
added process that never started, or started late), so none waits for a world that will never form and
either all of a world's processes enter `init_process_group` or none does.

A gloo send completes only when the peer posts the matching receive, so the protocol posts receives before it
waits on sends.

Every data message (worker <-> PS, tag 0) is one float32 tensor: a header of four float64 fields (in the
first 8 float32 slots) and the shard's flat payload (gradient or parameters). A worker's header is (kind:
PULL, GRAD, PAUSED or BYE; stop requested; the batch's loss; 0), a PS's answer's (PARAMS or PAUSE; stop
requested; 0; 0). Control messages (PS 0 <-> the others, tag 1) are four float64 fields (RESUME or STOP;
acknowledged steps; 0; 0), or serialized objects (length, then bytes).
"""

from __future__ import annotations

import io
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

TAG_DATA, TAG_CTRL = 0, 1
HEADER = 8  # float32 slots holding four float64 fields
# header[0] of a worker's message to a PS (BYE: its last, after PS 0 said stop)
PULL, GRAD, PAUSED, BYE = 0, 1, 2, 3
# header[0] of a PS's reply to a worker
PARAMS, PAUSE = 0, 1
# PS 0's decision, at the start and after every checkpoint
RESUME, STOP = 0, 1
# an elastic world's agreement, decided once (the first proposal wins): it forms, or the plan moved past it, or time ran out
GO, MOVED, TIMED_OUT = "go", "moved", "timed out"
AGREEMENT = "dl2/agreement/"  # the store's keys of the agreement (apart from init_process_group's)


class PeerLost(RuntimeError):
    """Another process of the configuration died, hung past the timeout or broke the protocol."""


class Superseded(Exception):
    """The job's plan moved past the configuration before its world formed: no process of it entered the world."""


def role_of(rank: int, num_ps: int) -> str:
    """`ps I` or `worker I` for a rank."""
    return f"ps {rank}" if rank < num_ps else f"worker {rank - num_ps}"


def store_path(state_dir: Path, generation: int, num_ps: int, num_workers: int) -> Path:
    """The rendezvous file of one configuration."""
    return state_dir / "rendezvous" / f"g{generation}-p{num_ps}-w{num_workers}"


def rendezvous(state_dir: Path, generation: int, num_ps: int, num_workers: int, rank: int, timeout: float,
               moved: Callable[[], bool] | None = None) -> None:
    """Join the configuration's world (blocks until all P + W processes have joined, or `timeout` seconds).
    `moved` (an elastic job's processes): whether the plan has moved past the configuration; the processes then
    first `agree` (within `timeout` seconds), and raise Superseded together if the plan moved before all of them
    arrived; once all have, the world forms at once."""
    path = store_path(state_dir, generation, num_ps, num_workers)
    path.parent.mkdir(exist_ok=True)
    world = num_ps + num_workers
    store = dist.FileStore(str(path), world)
    if moved is not None:
        decision = agree(store, rank, world, moved, timeout)
        if decision == MOVED:
            raise Superseded(f"the plan moved past generation {generation} before its {world} processes met in {path}")
        if decision == TIMED_OUT:
            raise PeerLost(f"the rendezvous of {world} processes in {path} did not complete within {timeout:g} s")
    try:  # `timeout` is also the world's limit on any one message
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise PeerLost(f"the rendezvous of {world} processes in {path} did not complete: {exc}") from None


def agree(store: dist.Store, rank: int, world: int, moved: Callable[[], bool], timeout: float, poll: float = 0.25,
          io_timeout: float = 2.0) -> str:
    """Whether a world of `world` processes forms, the same answer for each of them: GO, MOVED or TIMED_OUT.

    Each process marks its arrival on `store` and polls; the first to propose decides for all (`compare_set` on
    one key, which sets it only while it is unset and returns the value it holds): GO once every rank has arrived,
    MOVED once `moved()`, TIMED_OUT after `timeout` seconds. A process that finds the key set takes its value.
    A store whose file is gone (a FileStore then fails after `io_timeout` s) is MOVED if the plan has moved:
    only a newer generation's PS 0 removes it, and a world that formed has no process left polling."""
    previous, deadline = store.timeout, time.monotonic() + timeout
    store.set_timeout(timedelta(seconds=io_timeout))
    everyone, decision = [f"{AGREEMENT}arrived/{r}" for r in range(world)], f"{AGREEMENT}decision"
    try:
        store.set(f"{AGREEMENT}arrived/{rank}", "1")
        while not store.check([decision]):
            proposal = GO if store.check(everyone) else MOVED if moved() else TIMED_OUT if time.monotonic() > deadline else None
            if proposal is not None:
                return store.compare_set(decision, "", proposal).decode()
            time.sleep(poll)
        return store.get(decision).decode()
    except dist.DistStoreError:
        if moved():
            return MOVED
        raise
    finally:
        store.set_timeout(previous)


def leave() -> None:
    """Leave the configuration's world (its messages all done), so that the process can join another."""
    dist.destroy_process_group()


def remove_stores(state_dir: Path, below: int) -> None:
    """Delete the rendezvous files of generations below `below`: their worlds are over."""
    for path in (state_dir / "rendezvous").glob("g*-p*-w*"):
        if int(path.name.split("-")[0][1:]) < below:
            path.unlink(missing_ok=True)


def new_message(numel: int) -> torch.Tensor:
    """A zeroed data message with room for `numel` payload values."""
    return torch.zeros(HEADER + numel)


def header(msg: torch.Tensor) -> torch.Tensor:
    """The four float64 header fields of a data message (a view)."""
    return msg[:HEADER].view(torch.float64)


def payload(msg: torch.Tensor) -> torch.Tensor:
    """The payload of a data message (a view)."""
    return msg[HEADER:]


def exchange(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], tag: int, num_ps: int) -> None:
    """Post every receive, then every send, and wait for all; a failure names the peer."""
    work = [(dist.irecv(t, src=r, tag=tag), r) for t, r in recvs] + [(dist.isend(t, dst=r, tag=tag), r) for t, r in sends]
    for w, r in work:
        try:
            w.wait()
        except RuntimeError as exc:
            raise PeerLost(f"lost {role_of(r, num_ps)}: {exc}") from None


def send_control(cmd: int, steps: int, dsts: list[int], num_ps: int) -> None:
    """Send PS 0's decision `cmd` (RESUME or STOP) and the acknowledged step count to `dsts`."""
    msg = torch.tensor([cmd, steps, 0, 0], dtype=torch.float64)
    exchange([(msg, d) for d in dsts], [], TAG_CTRL, num_ps)


def recv_control(num_ps: int) -> tuple[int, int]:
    """Receive PS 0's decision: (RESUME or STOP, acknowledged steps)."""
    msg = torch.zeros(4, dtype=torch.float64)
    exchange([], [(msg, 0)], TAG_CTRL, num_ps)
    return int(msg[0]), int(msg[1])


def send_object(obj: Any, dst: int, num_ps: int) -> None:
    """Send tensors in plain containers (a shard's state) to `dst`."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    exchange([(torch.tensor([data.numel()]), dst)], [], TAG_CTRL, num_ps)
    exchange([(data, dst)], [], TAG_CTRL, num_ps)


def recv_object(src: int, num_ps: int) -> Any:
    """Receive what `send_object` sent from `src`."""
    size = torch.zeros(1, dtype=torch.int64)
    exchange([], [(size, src)], TAG_CTRL, num_ps)
    data = torch.empty(int(size), dtype=torch.uint8)
    exchange([], [(data, src)], TAG_CTRL, num_ps)
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


class Inbox:
    """A PS's receiving side: one thread per worker receives that worker's data messages into one queue.

    Receiving from each worker by rank (rather than from any source) lets gloo report a dead worker at once;
    the queue gives the PS the messages in arrival order, whichever worker sent them. A worker's BYE ends
    its thread (`close` waits for all), so no receive is left posted when the process leaves the world.
    """

    def __init__(self, workers: list[int], numel: int, num_ps: int):
        self.queue: queue.Queue = queue.Queue()
        self.num_ps = num_ps
        self.threads = [threading.Thread(target=self._receive, args=(rank, numel), daemon=True) for rank in workers]
        for thread in self.threads:
            thread.start()

    def _receive(self, rank: int, numel: int) -> None:
        while True:
            msg = torch.empty(HEADER + numel)
            try:
                dist.recv(msg, src=rank, tag=TAG_DATA)
            except RuntimeError as exc:
                self.queue.put((rank, PeerLost(f"lost {role_of(rank, self.num_ps)}: {exc}")))
                return
            if int(header(msg)[0]) == BYE:
                return
            self.queue.put((rank, msg))

    def close(self, timeout: float) -> None:
        """Wait for every worker's BYE (after PS 0's stop); PeerLost if one does not come within `timeout` s."""
        deadline = time.monotonic() + timeout
        for rank, thread in zip(range(self.num_ps, self.num_ps + len(self.threads)), self.threads):
            thread.join(max(deadline - time.monotonic(), 0.0))
            if thread.is_alive():
                raise PeerLost(f"{role_of(rank, self.num_ps)} did not say goodbye within {timeout:g} s")

    def get(self) -> tuple[int, torch.Tensor]:
        """The next message and its sender's rank; raises PeerLost if a worker was lost."""
        rank, msg = self.queue.get()
        if isinstance(msg, Exception):
            raise msg
        return rank, msg
