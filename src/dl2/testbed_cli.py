"""The `dl2 testbed …` and `dl2 k8s-scheduler …` subcommands (wired into `dl2.cli`)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

DEFAULT_POOL = "dl2"


def _scenario(args: argparse.Namespace):
    from dl2.sim.scenario import Scenario, SimOptions
    from dl2.workload.presets import PS_WORKER, get_preset

    return Scenario(get_preset(args.preset, args.params, world=PS_WORKER), SimOptions(assign_bundle=args.assign_bundle))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_testbed_up(args: argparse.Namespace) -> None:
    from dl2.errors import Dl2Error
    from dl2.kube.resources import create_nodes
    from dl2.testbed import local
    from dl2.workload.presets import PS_WORKER, get_preset

    if args.kind:
        from dl2.testbed import kind

        cluster = kind.up(args.folder, workers=args.workers, log=_log, isolate=args.isolate,
                          cpu_slots=kind.SLOTS_PER_NODE[0] if args.cpu_slots is None else args.cpu_slots)
        print(json.dumps({"kubeconfig": str(cluster.kubeconfig), "server": cluster.server, "control_plane": cluster.control_plane,
                          "workers": cluster.workers, "pool": kind.POOL, "node_image": cluster.node_image,
                          "runtime_image": cluster.runtime_image, "images": cluster.images_source,
                          "shared": {"host": str(cluster.shared), "node": kind.SHARED_IN_NODE},
                          "slots_per_node": list(cluster.slots_per_node), "cpu_millis_per_slot": cluster.cpu_millis_per_slot,
                          "docker": cluster.docker,
                          "timings": cluster.timings}, indent=2))
        return
    if not args.local:
        raise Dl2Error("say which testbed: `dl2 testbed up --local` (no Docker) or `dl2 testbed up --kind`")
    if args.isolate:
        raise Dl2Error("--isolate limits the CPU of pods that run: it is for the kind testbed (`dl2 testbed up --kind --isolate`); "
                       "the local testbed's KWOK nodes run none")
    if args.cpu_slots is not None:
        raise Dl2Error("--cpu-slots is for the kind testbed; the local testbed's nodes take their slots from --preset's node_cpu")
    preset = get_preset(args.preset, args.params, world=PS_WORKER)
    bed = local.up(args.folder, log=_log)
    kube = bed.kube()
    try:
        started = time.perf_counter()
        nodes = create_nodes(kube, args.pool, args.nodes or preset.num_nodes, preset.node_cpu, preset.node_gpu)
        nodes_s = time.perf_counter() - started
    except BaseException:
        local.down(bed.folder)
        raise
    finally:
        kube.close()
    print(json.dumps({"kubeconfig": str(bed.kubeconfig), "server": bed.server, "nodes": len(nodes), "pool": args.pool,
                      "timings": {**bed.timings, "nodes_ready_s": nodes_s}}, indent=2))


def cmd_testbed_down(args: argparse.Namespace) -> None:
    if args.kind:
        from dl2.testbed import kind

        print(json.dumps({"removed": kind.down(args.folder)}))
        return
    from dl2.testbed import local

    print(json.dumps({"stopped": local.down(args.folder)}))


def cmd_testbed_status(args: argparse.Namespace) -> None:
    if args.kind:
        from dl2.testbed import kind

        print(json.dumps(kind.status(args.folder), indent=2))
        return
    from dl2.testbed import local

    print(json.dumps(local.status(args.folder), indent=2))


def cmd_testbed_kubeconfig(args: argparse.Namespace) -> None:
    if args.kind:
        from dl2.testbed import kind

        print(kind.kubeconfig(args.folder))
        return
    from dl2.testbed import local

    print(local.load(args.folder).kubeconfig)


def cmd_testbed_build(args: argparse.Namespace) -> None:
    from dl2.testbed.build import ensure_binaries

    if args.kind:
        from dl2.testbed import kind

        binaries, images = kind.build(_log)
        print(json.dumps({"folder": str(binaries.folder), "build_s": binaries.build_seconds, "images": str(images.folder),
                          "node_image": images.node, "runtime_image": images.runtime, "images_build_s": images.build_seconds,
                          "image_steps_s": images.steps}, indent=2))
        return
    binaries = ensure_binaries(_log)
    print(json.dumps({"folder": str(binaries.folder), "build_s": binaries.build_seconds}))


def cmd_testbed_independence(args: argparse.Namespace) -> None:
    from dl2.sim_to_real.independence import independence
    from dl2.sim_to_real.profile import ProfileGrid
    from dl2.testbed import kind
    from dl2.workload.catalog import load_catalog

    catalog = load_catalog()
    for model in args.models:
        catalog.index(model)  # an unknown name says which are known
    grid = ProfileGrid(tuple(args.models), tuple(_configuration(text) for text in args.configurations), args.repeats, args.seconds)
    cluster = kind.load(args.folder)
    kube = cluster.kube()
    try:
        answer = independence(kube, kind.pod_runtime(args.folder), cluster.workers, cluster.slots_per_node[0], grid, args.out, log=_log)
    finally:
        kube.close()
    print(json.dumps(answer, indent=2))


def cmd_testbed_profile(args: argparse.Namespace) -> None:
    from dl2.paths import TESTBED_DIR
    from dl2.sim_to_real.profile import ProfileGrid, allowed_configurations, profile, spread, startup
    from dl2.testbed import kind
    from dl2.workload.catalog import load_catalog
    from dl2.workload.presets import PS_WORKER, get_preset

    catalog = load_catalog()
    models = tuple(args.models) if args.models else catalog.names
    for model in models:
        catalog.index(model)  # an unknown name says which are known
    cluster = kind.load(args.folder)
    if args.configurations:
        configurations = tuple(_configuration(text) for text in args.configurations)
    else:
        max_tasks = args.max_tasks or get_preset(args.preset, args.params, world=PS_WORKER).max_tasks
        configurations = allowed_configurations(max_tasks, len(cluster.workers), models)
    grid = ProfileGrid(models, configurations, args.repeats, args.seconds)
    _log(f"profile: {len(models)} job types x {len(grid.configurations)} configurations {list(grid.configurations)} x "
         f"{grid.repeats} repeats, {grid.seconds:g} s each, on {len(cluster.workers)} kind workers")
    kube = cluster.kube()
    try:
        table = profile(kube, kind.pod_runtime(args.folder), cluster.workers, grid, args.out or TESTBED_DIR, log=_log)
    finally:
        kube.close()
    cv = spread(table).cv.dropna()  # the spread over repeats (none with one repeat)
    print(json.dumps({"out": str(args.out or TESTBED_DIR), "measurements": len(table),
                      "median_cv": float(cv.median()) if len(cv) else None, "max_cv": float(cv.max()) if len(cv) else None,
                      "startup_seconds": startup(table)}, indent=2))


def cmd_testbed_check(args: argparse.Namespace) -> None:
    from dl2.config import load_params, section
    from dl2.errors import Dl2Error
    from dl2.learn import workflow
    from dl2.learn.agent import DL2Policy
    from dl2.learn.settings import learn_settings
    from dl2.schedulers.builtin import BUILTIN_POLICIES
    from dl2.schedulers.names import check_policy
    from dl2.sim_to_real.check import run_check
    from dl2.workload.presets import presets_from

    params = load_params(args.params)
    where = str(args.params or "params.yaml")
    settings = learn_settings({**section(params, "learn", where), "preset": args.preset}, presets_from(params, where), where)
    heuristics = [check_policy(name, BUILTIN_POLICIES, key="--policies") for name in args.policies]
    learned = {}
    for text in args.model:
        label, _, path = text.partition("=")
        if not label or not path:
            raise Dl2Error(f"--model: expected LABEL=PATH.pt, got {text!r}")
        learned[label] = DL2Policy.load(path)
    if args.traces < 1 or args.repeats < 1:
        raise Dl2Error(f"--traces and --repeats: at least 1 each, got {args.traces} and {args.repeats}")
    measured = workflow.scenario(settings)
    _, validation = workflow.split_traces(settings, measured)
    if args.traces > len(validation):
        raise Dl2Error(f"--traces: learn.validation_traces draws {len(validation)} validation traces, not {args.traces}")
    if args.restart_seconds is not None and args.restart_seconds < 0:
        raise Dl2Error(f"--restart-seconds: at least 0, got {args.restart_seconds}")
    result = run_check(validation[: args.traces], measured, heuristics, learned, args.repeats, args.out, args.folder, log=_log,
                       restart_seconds=args.restart_seconds, elastic=not args.whole_restarts)
    print(json.dumps({k: v for k, v in result.items() if k != "policies"} | {"policies": list(result["policies"])}, indent=2))


def _configuration(text: str) -> tuple[int, int]:
    """`P,W` on the command line: P PS and W workers."""
    from dl2.errors import Dl2Error

    try:
        num_ps, num_workers = (int(v) for v in text.split(","))
    except ValueError:
        raise Dl2Error(f"--configurations: expected P,W (PS and workers, e.g. 1,2), got {text!r}") from None
    return num_ps, num_workers


def cmd_testbed_submit(args: argparse.Namespace) -> None:
    from dl2.kube.client import Kube
    from dl2.kube.jobs import submit_trace
    from dl2.kube.resources import ensure_namespace
    from dl2.workload.catalog import load_catalog
    from dl2.workload.traces import read_trace

    catalog = load_catalog()
    trace = read_trace(args.trace, catalog)
    kube = Kube.from_kubeconfig(_kubeconfig(args))
    try:
        ensure_namespace(kube, args.namespace)
        names = submit_trace(kube, trace, catalog, args.namespace)
    finally:
        kube.close()
    print(f"submitted {len(names)} DL2Jobs to namespace {args.namespace}")


def _kubeconfig(args: argparse.Namespace) -> Path | None:
    """--kubeconfig; else in-cluster (None) with --in-cluster; else the kind testbed's with --kind; else the
    local testbed's."""
    if args.kubeconfig is not None or args.in_cluster:
        return args.kubeconfig
    if args.kind:
        from dl2.testbed import kind

        return kind.kubeconfig(args.kind_folder)
    from dl2.testbed import local

    return local.load(None).kubeconfig


def _workload(args: argparse.Namespace, scenario):
    """What the pods run: real training on the kind testbed (--trained), else the emulator's placeholders."""
    if not args.trained:
        return None
    if not args.kind:
        from dl2.errors import Dl2Error

        raise Dl2Error("--trained runs real training pods on the kind testbed: add --kind (after `dl2 testbed up --kind`)")
    from dl2.backends.workloads import Trained
    from dl2.testbed import kind

    return Trained(args.namespace, scenario.catalog.names, kind.pod_runtime(args.kind_folder), args.slot_seconds,
                   scenario.options.fine_grained_jct)


def cmd_scheduler_run(args: argparse.Namespace) -> None:
    from dl2.backends import load_scheduler
    from dl2.backends.kube import KubeCluster
    from dl2.backends.loop import run
    from dl2.kube.client import Kube
    from dl2.kube.jobs import job_name
    from dl2.kube.lease import Lease

    scheduler = load_scheduler(args.policy)
    kube = Kube.from_kubeconfig(_kubeconfig(args))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SystemExit: the lease is released on the way out
    try:
        scenario = _scenario(args)
        backend = KubeCluster(kube, scenario, args.namespace, args.pool, workload=_workload(args, scenario))
        lease = Lease(kube, args.namespace, duration=args.lease_seconds) if args.lease_seconds > 0 else None
        say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        slots_run = run(backend, scheduler, args.slot_seconds, args.max_slots, args.until_done, log=say,
                        progress=None if args.quiet else say, lease=lease)
        jct = {job_name(job): value for job, value in sorted(backend.jct().items())}  # as kubectl names the DL2Jobs
        # the cluster's clock counts the slots of every scheduler that ran the namespace (restarts included)
        result = {"cluster_slots": backend.slot, "slots_run": slots_run, "jct": jct}
        if not args.no_mlflow:
            from dl2 import tracking

            params = {"policy": args.policy, "preset": args.preset, "pool": args.pool, "slot_seconds": args.slot_seconds,
                      "trained": args.trained, "assign_bundle": args.assign_bundle}
            result["mlflow_run"] = tracking.log_scheduler_run(args.namespace, params, backend.jobs(), backend.slot, slots_run)
        print(json.dumps(result, indent=2))
    finally:
        kube.close()


def cmd_scheduler_task(args: argparse.Namespace) -> None:
    """What a task pod runs: it holds its place until the scheduler deletes it (progress is emulated)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"dl2 task: {args.role} of DL2Job {args.job}", flush=True)
    while True:
        time.sleep(3600)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    tb = sub.add_parser("testbed", help="a Kubernetes testbed: local (etcd, kube-apiserver, KWOK) or kind (Docker)")
    tb = tb.add_subparsers(dest="action", required=True)
    folder = argparse.ArgumentParser(add_help=False)
    folder.add_argument("--folder", type=Path, default=None,
                        help="the testbed's folder (default: ~/.cache/dl2/testbed/run, or .../kind with --kind)")
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument("--kind", action="store_true", help="the kind testbed (a multi-node cluster in Docker) instead of the local one")
    up = tb.add_parser("up", parents=[folder, which], help="build (first time) and start the testbed; prints its kubeconfig path")
    up.add_argument("--local", action="store_true", help="the Docker-free local control plane")
    up.add_argument("--preset", default="paper", help="local: nodes mirror this preset's cluster (default: paper)")
    up.add_argument("--params", type=Path, default=None)
    up.add_argument("--nodes", type=int, default=None, help="local: how many nodes (default: the preset's num_nodes)")
    up.add_argument("--pool", default=DEFAULT_POOL, help=f"local: node pool label dl2.io/pool (default: {DEFAULT_POOL})")
    up.add_argument("--workers", type=int, default=3, help="kind: how many worker nodes (default: 3)")
    up.add_argument("--isolate", action="store_true",
                    help="kind: each task pod gets a CPU limit of its CPU slots' share of the host's cores, so a job's "
                         "speed depends on its own slots, not its neighbours' (default: pods share the host)")
    up.add_argument("--cpu-slots", type=int, default=None,
                    help="kind: the CPU slots each worker advertises (default: 8, the paper's node); a preset of this "
                         "cluster sets node_cpu to it")
    up.set_defaults(func=cmd_testbed_up)
    for name, func, text in (("down", cmd_testbed_down, "stop the testbed (kind: remove its nodes, network, rules and daemon)"),
                             ("status", cmd_testbed_status, "which of its processes or nodes run; timings"),
                             ("kubeconfig", cmd_testbed_kubeconfig, "print the kubeconfig path")):
        tb.add_parser(name, parents=[folder, which], help=text).set_defaults(func=func)
    tb.add_parser("build", parents=[which], help="build the binaries into the cache (--kind: and the node and runtime images)"
                  ).set_defaults(func=cmd_testbed_build)
    prof = tb.add_parser("profile", parents=[folder],
                         help="measure every job type's speed at each (#PS, #workers) on the kind testbed; write a speed table")
    prof.add_argument("--models", nargs="+", default=None, help="job types to profile (default: all 8)")
    prof.add_argument("--preset", default="testbed", help="the configurations go up to this preset's max_tasks (default: testbed)")
    prof.add_argument("--params", type=Path, default=None)
    prof.add_argument("--max-tasks", type=int, default=None, help="profile up to this many PS and workers (default: the preset's)")
    prof.add_argument("--configurations", nargs="+", default=None, metavar="P,W",
                      help="profile these (#PS, #workers) instead (default: every one up to --max-tasks that fits)")
    prof.add_argument("--repeats", type=int, default=3, help="measurements of each configuration, each a fresh job (default 3)")
    prof.add_argument("--seconds", type=float, default=10.0, help="seconds of training measured per configuration (default 10)")
    prof.add_argument("--out", type=Path, default=None, help="where to write speed.txt, profile.csv, testbed.json (default: data/testbed)")
    prof.set_defaults(func=cmd_testbed_profile)
    ind = tb.add_parser("independence", parents=[folder],
                        help="measure job types' speeds on the kind testbed alone and with the rest of the cluster busy")
    ind.add_argument("--models", nargs="+", default=["resnet-50"], help="job types to measure (default: resnet-50)")
    ind.add_argument("--configurations", nargs="+", default=["1,1", "2,2"], metavar="P,W",
                     help="(#PS, #workers) to measure (default: 1,1 2,2)")
    ind.add_argument("--repeats", type=int, default=2, help="measurements alone and busy of each, each a fresh job (default 2)")
    ind.add_argument("--seconds", type=float, default=8.0, help="seconds of training measured per configuration (default 8)")
    ind.add_argument("--out", type=Path, default=Path("independence.json"), help="the JSON (default: independence.json)")
    ind.set_defaults(func=cmd_testbed_independence)
    check = tb.add_parser("check", parents=[folder],
                          help="replay validation traces on the kind testbed and in the calibrated simulator; is the simulator "
                               "within 15%% of kind per policy, and do the policies rank the same?")
    check.add_argument("--preset", default="testbed", help="the testbed's preset (default: testbed)")
    check.add_argument("--params", type=Path, default=None)
    check.add_argument("--policies", nargs="+", default=["fifo", "drf", "optimus"], help="heuristics (default: fifo drf optimus)")
    check.add_argument("--model", action="append", default=[], metavar="LABEL=PATH",
                       help="a DL2 policy (.pt) replayed greedily under LABEL; repeat for more")
    check.add_argument("--traces", type=int, default=3, help="the first validation traces `evaluate` draws (default 3)")
    check.add_argument("--repeats", type=int, default=3, help="replays of each (policy, trace) on kind (default 3)")
    check.add_argument("--restart-seconds", type=float, default=None,
                       help="the simulator predicts with this restart cost instead of the preset's (the kept replays serve any)")
    check.add_argument("--whole-restarts", action="store_true",
                       help="every resize restarts the job's pods whole instead of keeping the survivors (to compare; "
                            "each mode keeps its own replays)")
    check.add_argument("--out", type=Path, default=Path("data/testbed-check"),
                       help="where the tables, check.json and the figure go (default: data/testbed-check)")
    check.set_defaults(func=cmd_testbed_check)
    connect = argparse.ArgumentParser(add_help=False)
    connect.add_argument("--kubeconfig", type=Path, default=None, help="default: the local testbed's (--kind: the kind testbed's)")
    connect.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    connect.add_argument("--kind", action="store_true", help="the kind testbed (`dl2 testbed up --kind`)")
    connect.add_argument("--kind-folder", type=Path, default=None, help="the kind testbed's folder (default: its default)")
    connect.add_argument("--namespace", default="default")
    submit = tb.add_parser("submit", parents=[connect], help="submit a trace CSV as DL2Jobs")
    submit.add_argument("--trace", type=Path, required=True)
    submit.set_defaults(func=cmd_testbed_submit)

    ks = sub.add_parser("k8s-scheduler", help="the dl2 Kubernetes scheduler and progress emulator")
    ks = ks.add_subparsers(dest="action", required=True)
    runp = ks.add_parser("run", parents=[connect], help="schedule DL2Jobs slot by slot")
    runp.add_argument("--policy", default="drf", help="a heuristic (fifo, srtf, drf, tetris, optimus) or a DL2 model .pt")
    runp.add_argument("--preset", default="paper", help="max_tasks and the speed table come from this preset")
    runp.add_argument("--params", type=Path, default=None)
    runp.add_argument("--assign-bundle", action="store_true", help="one bundle per job before the policy acts")
    runp.add_argument("--pool", default=DEFAULT_POOL, help=f"schedule onto nodes labelled dl2.io/pool=POOL (default: {DEFAULT_POOL})")
    runp.add_argument("--slot-seconds", type=float, default=1.0, help="wall-clock seconds per slot (default 1; the model's slot is 1200 s)")
    runp.add_argument("--max-slots", type=int, default=None)
    runp.add_argument("--until-done", action="store_true", help="stop once every DL2Job has succeeded or failed")
    runp.add_argument("--lease-seconds", type=float, default=15.0,
                      help="act only while holding the namespace's Lease, renewed within this many seconds; 0: no lease "
                           "(default 15: of several schedulers of a namespace, one acts)")
    runp.add_argument("--trained", action="store_true",
                      help="with --kind: PS and worker pods really train (python -m dl2.testbed.training) and report their "
                           "progress; without: pods hold their place and the emulator gives progress from the speed table")
    runp.add_argument("--quiet", action="store_true", help="no line per slot on stderr")
    runp.add_argument("--no-mlflow", action="store_true", help="do not record the run (params, per-job JCTs) in the MLflow store")
    runp.set_defaults(func=cmd_scheduler_run)
    task = ks.add_parser("task", help="a task pod's process (holds its place; progress is emulated)")
    task.add_argument("--job", required=True)
    task.add_argument("--role", required=True)
    task.set_defaults(func=cmd_scheduler_task)
