"""Real data-parallel training for the Kubernetes testbed: the PS and worker processes of a DL2 job.

Every process of a job runs the same command (one world of P PS and W workers per configuration):

    python -m dl2.testbed.training --job NAME --model MODEL --role {ps,worker} --index I --num-ps P --num-workers W
        --state DIR --epochs E --generation G [--mode {sync,async}] [--seed S] [--checkpoint-every K]
        [--checkpoint-seconds T] [--log-seconds L] [--timeout SECONDS] [--stop-timeout SECONDS]

or, for an elastic job, `--member NAME` instead of the five configuration flags: the process takes its role,
index, P, W and G from the job's plan (`DIR/plan.json`, written by the controller: `plan`); when the plan
moves to a newer generation, PS 0 checkpoints and stops the world, and every process still a member joins
the new configuration without restarting (only added processes pay the start-up); one that is no longer a
member exits 0.

MODEL is one of the catalog's job types; each trains a CPU-sized stand-in (`models`). The PS hold the
parameters, sharded by whole tensors (`shards`); workers pull every shard, compute gradients on their own
synthetic batches and push each shard's part to its PS, which apply the optimizer: in sync mode the mean
of one gradient per worker, in async mode each gradient as it arrives (`ps`, `worker`). The processes find
each other through a FileStore in DIR (`comm`); G (the scheduler's slot) keeps configurations apart.
Gloo connects the processes at the address their hostname resolves to (a pod's IP in Kubernetes); set
GLOO_SOCKET_IFNAME to choose an interface instead. DIR must support flock (a local or bind-mounted folder).

A step is one worker batch (one gradient); a sync update with W workers is W steps, an async update one.
A step is acknowledged once it is in a checkpoint. PS 0 checkpoints every K steps and/or T seconds, when
the job reaches E epochs, and when any process of the job gets SIGTERM (then every process exits 0). A
new configuration (any P', W') resumes from the checkpoint with the same parameters, optimizer state and
step count; its PS 0 first waits until the previous configuration's PS 0 has exited (it may still be
writing its last checkpoint). A process killed with SIGKILL makes the others exit 1; a restart resumes
from the last checkpoint. Exit codes: 0 done or stopped, 1 a peer lost or a timeout, 2 bad flags or a stale generation.

Files in DIR, each written atomically (temporary file, fsync, rename), only by PS 0:

- `checkpoint.pt` (torch.save of plain data, loads with weights_only=True): format
  "dl2-training-checkpoint/1"; job, model; params {tensor name: tensor}; optimizer {tensor name: {state
  key: tensor}} (momentum_buffer for SGD; step, exp_avg, exp_avg_sq for Adam); steps, updates; loss,
  first_loss; train_seconds; done; generation, num_ps, num_workers, mode of the configuration that wrote it.
- `progress.json`, rewritten after every checkpoint (read it with `read_progress(DIR)`):
  job, model; steps (acknowledged), updates, steps_per_epoch, epochs (= steps / steps_per_epoch),
  target_epochs (E), done (true once steps >= E epochs; the last write); loss (mean training loss of the
  batches the checkpoint acknowledged; the previous value if none), first_loss (the same at the job's first
  checkpoint); generation, num_ps, num_workers, mode (the configuration that wrote it), start_step (the
  acknowledged step it started from); steps_per_second
  (that configuration's steps over its seconds since its rendezvous and start: the batches per second of
  all its workers together, DL2's speed), train_seconds (seconds of training over all configurations),
  time (Unix time of the write). The loss values are null until a checkpoint has acknowledged a step.
- `plan.json` (written by the controller, not PS 0; elastic jobs only): the configuration to form (`plan`).
- `owner.lock` (flock held by the live PS 0) and `owner.json` ({generation, pid, host, since}: the
  configuration that owns the folder); `rendezvous/g<G>-p<P>-w<W>` (FileStore of a configuration).

The log: plain lines on stdout, flushed (what `kubectl logs` of a pod shows), one format:

    <UTC time> [<job> g<generation> <role> <index>/<count>] <event>: <details>

with the events `start` (every process, first: model, configuration, generation, seed, state folder, pid),
`wait` (PS 0, once, if the previous configuration still owns the folder), `train` (once training begins: PS 0
says whether it resumed and from which step, a worker the digest of the parameters it pulled),
`progress` (PS 0, every --log-seconds L without a checkpoint: step, epochs, mean loss since the last
checkpoint, steps/s since its previous line), `checkpoint` (PS 0: the same, steps/s since the previous
checkpoint, and the file written; the others: the step acknowledged), `rejoin` (an elastic job's process that
joins the plan's next configuration: its P, W, generation), `abandon` (an elastic job's process whose
configuration the plan moved past before its world formed: it follows the plan) and `exit` (every process,
last: the exit code and why). Nothing is logged per step.
"""

from dl2.testbed.training.progress import read_progress

__all__ = ["read_progress"]
