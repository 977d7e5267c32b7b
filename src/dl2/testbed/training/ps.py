"""The parameter servers: each holds one shard of the parameters and its optimizer state; PS 0 also coordinates.

A PS answers every worker message. A pull is answered with the shard's parameters. A gradient is applied
with the stand-in's optimizer: in sync mode the PS waits for one gradient from every worker and applies
their mean, then answers them all with the same new parameters; in async mode it applies each gradient as
it arrives and answers that worker alone.

PS 0 decides when to checkpoint (every k steps, every t seconds, on SIGTERM anywhere in the job, at the
target, when an elastic job's plan moves to a newer configuration): from then on it answers "pause" instead
of "parameters". A paused worker tells every PS so; once all workers have paused, every PS has applied
exactly the same gradients, the other PS send PS 0 their shards, and PS 0 writes the checkpoint and the
progress file, then tells everyone to resume or to stop.
"""

from __future__ import annotations

import threading
import time

import torch

from dl2.errors import Dl2Error
from dl2.testbed.training import comm
from dl2.testbed.training.checkpoint import CHECKPOINT, Checkpoint, load_checkpoint, progress_record
from dl2.testbed.training.job import JobConfig
from dl2.testbed.training.models import get_standin
from dl2.testbed.training.plan import PlanWatch
from dl2.testbed.training.progress import write_progress
from dl2.testbed.training.shards import Shard, make_shards


class ParameterServer:
    """PS `job.index` (not 0): serves its shard and follows PS 0's decisions."""

    def __init__(self, job: JobConfig, stop: threading.Event):
        self.job, self.stop = job, stop
        self.standin = get_standin(job.model)
        self.shards = make_shards(self.standin.model(job.seed), job.num_ps)
        self.shard: Shard = self.shards[job.index]
        self.params: list[torch.Tensor] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.steps = self.updates = 0
        self.reply = comm.new_message(self.shard.numel)

    def run(self) -> None:
        """Serve until PS 0 says stop."""
        if not self.start():
            return
        workers = list(range(self.job.num_ps, self.job.world))
        inbox = comm.Inbox(workers, self.shard.numel, self.job.num_ps)
        paused: set[int] = set()
        while True:
            batch = self.receive(inbox)
            kinds = {int(comm.header(m)[0]) for m in batch.values()}
            for msg in batch.values():
                self.note(comm.header(msg))
            if kinds == {comm.PAUSED}:
                paused.update(batch)
                if len(paused) == len(workers):
                    if self.checkpoint():
                        inbox.close(self.job.timeout)
                        return
                    paused.clear()
                continue
            if kinds == {comm.GRAD}:
                self.apply([comm.payload(batch[r]) for r in sorted(batch)])  # in rank order: sync training is deterministic
            elif kinds != {comm.PULL}:
                raise comm.PeerLost(f"protocol error: ps {self.job.index} got message kinds {sorted(kinds)} in one synchronous step")
            self.answer(list(batch))

    def start(self) -> bool:
        """Receive PS 0's go-ahead and this shard's state; False if the job is done already."""
        cmd, self.steps = comm.recv_control(self.job.num_ps)
        if cmd == comm.STOP:  # the job is done already
            return False
        state = comm.recv_object(0, self.job.num_ps)
        self.load(state["params"], state["optimizer"], state["steps"], state["updates"])
        self.job.log("train", f"from step {self.steps}, serving {len(self.shard.names)} tensors ({self.shard.numel} values)")
        return True

    def load(self, params: dict[str, torch.Tensor], optimizer: dict[str, dict[str, torch.Tensor]], steps: int, updates: int) -> None:
        """Take this shard's tensors and optimizer state out of whole-model dictionaries."""
        self.params = [params[name].detach().clone().requires_grad_(True) for name in self.shard.names]
        self.optimizer = self.standin.make_optimizer(self.params) if self.params else None
        for name, p in zip(self.shard.names, self.params):
            if name in optimizer:
                self.optimizer.state[p] = {k: v.clone() for k, v in optimizer[name].items()}
        self.steps, self.updates = steps, updates

    def state(self) -> dict:
        """This shard's tensors and optimizer state by name, and the counts."""
        opt = {} if self.optimizer is None else self.optimizer.state
        named = list(zip(self.shard.names, self.params))
        return {"steps": self.steps, "updates": self.updates, "params": {name: p.detach().clone() for name, p in named},
                "optimizer": {name: {k: v.clone() for k, v in opt[p].items()} for name, p in named if opt.get(p)}}

    def receive(self, inbox: comm.Inbox) -> dict[int, torch.Tensor]:
        """The next message (async), or one message from every worker (sync), by sender rank."""
        if self.job.mode == "async":
            rank, msg = inbox.get()
            return {rank: msg}
        batch: dict[int, torch.Tensor] = {}
        while len(batch) < self.job.num_workers:
            rank, msg = inbox.get()
            if rank in batch:
                raise comm.PeerLost(f"protocol error: two messages from {comm.role_of(rank, self.job.num_ps)} in one synchronous step")
            batch[rank] = msg
        return batch

    def note(self, header: torch.Tensor) -> None:
        """What PS 0 learns from a worker's header (other PS learn nothing)."""

    def apply(self, grads: list[torch.Tensor]) -> None:
        """One optimizer update with the mean of `grads` (flat, this shard's layout)."""
        if self.optimizer is not None:
            grad = grads[0] if len(grads) == 1 else torch.stack(grads).mean(dim=0)
            for p, g in zip(self.params, self.shard.split(grad)):
                p.grad = g
            self.optimizer.step()
        self.steps += len(grads)
        self.updates += 1

    def answer(self, ranks: list[int]) -> None:
        """Send the shard's parameters (or PS 0's pause) to the workers of `ranks`."""
        h = comm.header(self.reply)
        h[0], h[1] = self.command(), float(self.stop.is_set())
        self.shard.flatten(self.params, comm.payload(self.reply))
        comm.exchange([(self.reply, r) for r in ranks], [], comm.TAG_DATA, self.job.num_ps)

    def command(self) -> int:
        """What this PS's answers say besides the parameters."""
        return comm.PARAMS

    def checkpoint(self) -> bool:
        """All workers paused: hand the shard to PS 0 and follow its decision; True to stop."""
        comm.send_object({**self.state(), "stop": self.stop.is_set()}, 0, self.job.num_ps)
        cmd, steps = comm.recv_control(self.job.num_ps)
        self.job.log("checkpoint", f"step {steps} acknowledged" + (", stopping" if cmd == comm.STOP else ""))
        return cmd == comm.STOP


class Coordinator(ParameterServer):
    """PS 0: loads and re-shards the checkpoint, decides when to checkpoint, writes checkpoints and progress."""

    def __init__(self, job: JobConfig, stop: threading.Event):
        super().__init__(job, stop)
        self.target = job.target_steps
        self.pausing = self.stop_seen = False
        self.losses: list[float] = []
        self.last: Checkpoint | None = None
        self.plan = PlanWatch(job.state, job.generation) if job.member else None  # an elastic job's newer configuration

    def start(self) -> bool:
        """Load the checkpoint (or the seed's initial model), send each PS its shard; False if the job is done."""
        job = self.job
        ckpt = load_checkpoint(job.state, job.job, job.model)
        names = [n for s in self.shards for n in s.names]
        if ckpt is None:
            model = self.standin.model(job.seed)
            ckpt = Checkpoint(job.job, job.model, {n: p.detach().clone() for n, p in model.named_parameters()})
        elif sorted(ckpt.params) != sorted(names):
            raise Dl2Error(f"{job.state}: the checkpoint's tensors are not those of the {job.model} stand-in; "
                           "it was written by another version of dl2: move it away to start the job over")
        self.last = ckpt
        done = ckpt.done and ckpt.steps >= self.target
        comm.send_control(comm.STOP if done else comm.RESUME, ckpt.steps, list(range(1, job.world)), job.num_ps)
        if done:
            self.steps = ckpt.steps
            return False
        for p in range(1, job.num_ps):
            mine = set(self.shards[p].names)
            comm.send_object({"steps": ckpt.steps, "updates": ckpt.updates, "params": {n: ckpt.params[n] for n in mine},
                              "optimizer": {n: s for n, s in ckpt.optimizer.items() if n in mine}}, p, job.num_ps)
        self.load(ckpt.params, ckpt.optimizer, ckpt.steps, ckpt.updates)
        self.began, self.began_steps = time.monotonic(), ckpt.steps
        self.checkpointed_at, self.checkpointed_steps = self.began, ckpt.steps
        self.logged_at, self.logged_steps = self.began, ckpt.steps
        start = f"resumed from step {ckpt.steps}" if ckpt.steps else "a new job, from step 0"
        self.job.log("train", f"{start} ({self.epochs(ckpt.steps)}), checkpoint {job.state / CHECKPOINT}")
        return True

    def epochs(self, steps: int) -> str:
        """`steps` in the job's epochs, for a log line."""
        return f"{steps / self.standin.steps_per_epoch:.3f} of {self.job.epochs:g} epochs"

    def apply(self, grads: list[torch.Tensor]) -> None:
        """One update; a progress line once `log_seconds` have passed since the last line."""
        super().apply(grads)
        now = time.monotonic()
        if self.job.log_seconds > 0 and now - self.logged_at >= self.job.log_seconds:
            self.log_line("progress", now, self.logged_at, self.logged_steps, "")

    def log_line(self, event: str, now: float, since: float, since_steps: int, tail: str) -> None:
        """A progress or checkpoint line: the step, the epochs, the mean loss of the batches since the last
        checkpoint, and the steps per second since (`since`, `since_steps`)."""
        loss = sum(self.losses) / len(self.losses) if self.losses else self.last.loss
        rate = (self.steps - since_steps) / max(now - since, 1e-9)
        self.job.log(event, f"step {self.steps} ({self.epochs(self.steps)}), loss {'n/a' if loss is None else f'{loss:.4f}'}, "
                            f"{rate:.1f} steps/s{tail}")
        self.logged_at, self.logged_steps = now, self.steps

    def note(self, header: torch.Tensor) -> None:
        """Collect the workers' losses and any stop request they relay."""
        if header[1]:
            self.stop_seen = True
        if int(header[0]) == comm.GRAD:
            self.losses.append(float(header[2]))

    def command(self) -> int:
        """PAUSE from the moment a checkpoint is due until it is written."""
        if not self.pausing:
            job = self.job
            self.pausing = (self.stop.is_set() or self.stop_seen or self.steps >= self.target or self.resizing()
                            or (job.checkpoint_every > 0 and self.steps - self.checkpointed_steps >= job.checkpoint_every)
                            or (job.checkpoint_seconds > 0 and time.monotonic() - self.checkpointed_at >= job.checkpoint_seconds))
        return comm.PAUSE if self.pausing else comm.PARAMS

    def resizing(self) -> bool:
        """Whether an elastic job's plan has a newer configuration than this one."""
        return self.plan is not None and self.plan.moved()

    def checkpoint(self) -> bool:
        """All workers paused: gather the shards, write checkpoint and progress, tell everyone; True to stop."""
        job, last = self.job, self.last
        states = [self.state()] + [comm.recv_object(p, job.num_ps) for p in range(1, job.num_ps)]
        if any(s["steps"] != self.steps for s in states):
            raise comm.PeerLost(f"protocol error: the PS applied different numbers of steps {[s['steps'] for s in states]}")
        self.stop_seen |= any(s.get("stop", False) for s in states)
        now = time.monotonic()
        loss = sum(self.losses) / len(self.losses) if self.losses else last.loss
        ckpt = Checkpoint(job.job, job.model, params={}, optimizer={}, steps=self.steps, updates=self.updates, loss=loss,
                          first_loss=last.first_loss if last.first_loss is not None else (loss if self.losses else None),
                          train_seconds=last.train_seconds + now - self.checkpointed_at, done=self.steps >= self.target,
                          generation=job.generation, num_ps=job.num_ps, num_workers=job.num_workers, mode=job.mode)
        for s in states:
            ckpt.params.update(s["params"])
            ckpt.optimizer.update(s["optimizer"])
        ckpt.save(job.state)
        rate = (self.steps - self.began_steps) / max(now - self.began, 1e-9)
        write_progress(job.state, progress_record(ckpt, self.standin.steps_per_epoch, job.epochs, rate, self.began_steps))
        resizing = self.resizing()
        stop = ckpt.done or self.stop.is_set() or self.stop_seen or resizing
        comm.send_control(comm.STOP if stop else comm.RESUME, self.steps, list(range(1, job.world)), job.num_ps)
        why = ", done" if ckpt.done else (", stopping" if self.stop.is_set() or self.stop_seen else ", resizing" if resizing else "")
        self.log_line("checkpoint", now, self.checkpointed_at, self.checkpointed_steps, f", written to {job.state / CHECKPOINT}{why}")
        self.last, self.losses, self.pausing = ckpt, [], False
        self.checkpointed_at, self.checkpointed_steps = now, self.steps
        return stop
