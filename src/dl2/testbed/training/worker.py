"""A worker: pulls every shard, computes a gradient on its own synthetic batch, pushes each shard's part to its PS.

Its batches come from a generator seeded by (job seed, generation, worker index), so every worker of every
configuration sees its own data of the job's one task. Each push is answered with the shard's new
parameters, or with PS 0's pause: then the worker tells every PS it has paused and waits for PS 0's
decision (resume or stop) after the checkpoint; told to stop, it says goodbye to every PS.
"""

from __future__ import annotations

import threading

import torch

from dl2.testbed.training import comm
from dl2.testbed.training.checkpoint import params_digest
from dl2.testbed.training.job import JobConfig
from dl2.testbed.training.models import get_standin
from dl2.testbed.training.shards import make_shards


class Worker:
    """Worker `job.index` of its configuration."""

    def __init__(self, job: JobConfig, stop: threading.Event):
        self.job, self.stop = job, stop
        self.standin = get_standin(job.model)
        self.model = self.standin.model(job.seed)
        self.task = self.standin.make_task(job.seed)
        self.data = torch.Generator().manual_seed((job.seed * 1_000_003 + job.generation * 7_919 + job.index) % 2**62)
        self.shards = make_shards(self.model, job.num_ps)
        named = dict(self.model.named_parameters())
        self.tensors = [[named[n] for n in s.names] for s in self.shards]
        self.out = [comm.new_message(s.numel) for s in self.shards]
        self.back = [comm.new_message(s.numel) for s in self.shards]
        self.paused = self.stop_heard = False
        self.steps = 0  # the job's acknowledged steps, as PS 0 last said

    def run(self) -> None:
        """Train until PS 0 says stop."""
        cmd, self.steps = comm.recv_control(self.job.num_ps)
        if cmd == comm.STOP:  # the job is done already
            return
        self.push(comm.PULL)
        digest = params_digest(dict(self.model.named_parameters()))
        self.job.log("train", f"from step {self.steps}, pulled the parameters (sha256 {digest})")
        while True:
            if self.paused:
                self.push(comm.PAUSED, answered=False)
                cmd, self.steps = comm.recv_control(self.job.num_ps)
                self.job.log("checkpoint", f"step {self.steps} acknowledged" + (", stopping" if cmd == comm.STOP else ""))
                if cmd == comm.STOP:
                    self.push(comm.BYE, answered=False)
                    return
                self.paused = False
            self.push(comm.GRAD, self.gradient())

    def gradient(self) -> float:
        """Compute the gradient of one batch into the outgoing messages; the batch's loss."""
        self.model.zero_grad(set_to_none=True)
        loss = self.task.loss(self.model, self.task.batch(self.data, self.standin.batch_size))
        loss.backward()
        for shard, tensors, msg in zip(self.shards, self.tensors, self.out):
            shard.flatten([t.grad if t.grad is not None else torch.zeros_like(t) for t in tensors], comm.payload(msg))
        return loss.item()

    def push(self, kind: int, loss: float = 0.0, answered: bool = True) -> None:
        """Send `kind` (and the gradient) to every PS; take the new parameters from the answers."""
        for msg in self.out:
            h = comm.header(msg)
            h[0], h[1], h[2] = kind, float(self.stop.is_set() or self.stop_heard), loss
        ps = range(self.job.num_ps)
        comm.exchange([(self.out[p], p) for p in ps], [(self.back[p], p) for p in ps] if answered else [], comm.TAG_DATA, self.job.num_ps)
        if not answered:
            return
        with torch.no_grad():
            for shard, tensors, msg in zip(self.shards, self.tensors, self.back):
                h = comm.header(msg)
                self.paused |= int(h[0]) == comm.PAUSE
                self.stop_heard |= bool(h[1])
                for t, value in zip(tensors, shard.split(comm.payload(msg))):
                    t.copy_(value)
