"""The `dl2` command: one subcommand per user-facing action. Errors print one line and exit 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dl2.errors import Dl2Error


def _scenario(args: argparse.Namespace):
    from dl2.sim.scenario import SPEED_MODELS, Scenario, SimOptions
    from dl2.workload.presets import get_preset

    if args.speed_model not in SPEED_MODELS:
        raise Dl2Error(f"--speed-model: expected one of {SPEED_MODELS}, got {args.speed_model!r}")
    options = SimOptions(fine_grained_jct=not args.integer_jct, assign_bundle=args.assign_bundle, speed_model=args.speed_model)
    return Scenario(get_preset(args.preset, args.params), options)


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="paper", help="a preset of the params file (default: paper)")
    p.add_argument("--params", type=Path, default=None, help="params file with the presets (default: the project's params.yaml)")
    p.add_argument("--integer-jct", action="store_true", help="count the last slot whole (default: fine-grained JCT)")
    p.add_argument("--assign-bundle", action="store_true", help="give every job one bundle before the policy acts")
    p.add_argument("--speed-model", default="measured", help="measured (default) or analytical")


def cmd_trace_generate(args: argparse.Namespace) -> None:
    from dl2.compare import generate_trace_set
    from dl2.workload.presets import get_preset

    stats = generate_trace_set(get_preset(args.preset, args.params), args.num, args.seed, args.out, args.arrivals, args.lengths)
    print(stats.to_string(index=False))


def cmd_trace_validate(args: argparse.Namespace) -> None:
    from dl2.workload.catalog import load_catalog
    from dl2.workload.traces import read_trace

    for path in args.files:
        trace = read_trace(path, load_catalog())
        print(f"{path}: ok, {len(trace)} jobs")


def cmd_trace_stats(args: argparse.Namespace) -> None:
    from dl2.workload.catalog import load_catalog
    from dl2.workload.traces import read_trace

    print(json.dumps(read_trace(args.file, load_catalog()).stats(), indent=2))


def cmd_simulate(args: argparse.Namespace) -> None:
    from dl2.backends.sim import simulate
    from dl2.metrics import job_table, summarize
    from dl2.paths import write_csv_atomic
    from dl2.workload.traces import read_trace

    scenario = _scenario(args)
    trace = read_trace(args.trace, scenario.catalog)
    result = simulate(trace, args.policy, scenario)
    if args.jobs_out:
        write_csv_atomic(args.jobs_out, job_table(result, scenario))
    print(json.dumps({"policy": result.policy, "preset": scenario.preset.name, **summarize(result, scenario)}, indent=2))


def cmd_compare(args: argparse.Namespace) -> None:
    import pandas as pd

    from dl2.compare import aggregate, compare, trace_files
    from dl2.paths import write_csv_atomic

    scenario = _scenario(args)
    files = [f for t in args.traces for f in trace_files(t)]
    result = compare(files, args.policies, scenario, progress=not args.quiet)
    if args.out:
        write_csv_atomic(args.out, result.summary)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(aggregate(result.summary).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def cmd_stage(args: argparse.Namespace) -> None:
    from dl2.stages import run_stage

    print(run_stage(args.stage, args.params, args.data_dir))


def cmd_publish(args: argparse.Namespace) -> None:
    from dl2.paths import repo_root
    from dl2.publish import publish_ablations, publish_testbed

    data_dir = (args.data_dir or repo_root() / "data").resolve()
    if args.testbed == (args.group is not None):
        raise Dl2Error("say what to publish: --group GROUP (an ablate stage's axes) or --testbed (a kind testbed run)")
    if args.testbed:
        files = publish_testbed(data_dir)
        print(f"published {len(files)} files into {data_dir / 'published' / 'testbed'}")
        return
    axes = publish_ablations(data_dir, args.group)
    print(f"published {', '.join(axes)} into {data_dir / 'published' / 'ablations'} (ablate-{args.group}.json)")


def cmd_bench(args: argparse.Namespace) -> None:
    if args.ray:
        from dl2.bench_ray import ray_benchmark

        print(json.dumps(ray_benchmark(args.out or Path("bench-ray.json")), indent=2))
        return
    from dl2.bench import run_benchmark

    print(json.dumps(run_benchmark(args.out or Path("bench.json"), repeats=args.repeats, learn=not args.no_learn), indent=2))


def build_parser() -> argparse.ArgumentParser:
    from dl2.schedulers import policy_names

    parser = argparse.ArgumentParser(prog="dl2", description="DL2 scheduler: traces, simulation, comparison, pipeline stages.")
    sub = parser.add_subparsers(dest="command", required=True)

    trace = sub.add_parser("trace", help="generate, validate or describe job traces").add_subparsers(dest="action", required=True)
    gen = trace.add_parser("generate", help="write a set of traces for a preset")
    gen.add_argument("--preset", default="paper")
    gen.add_argument("--params", type=Path, default=None)
    gen.add_argument("--num", type=int, default=10, help="how many traces (default 10)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--arrivals", default="ali", help="ali | google | poisson | uniform")
    gen.add_argument("--lengths", default="ali", help="ali | fixed | normal")
    gen.add_argument("--out", type=Path, required=True, help="folder to write trace_000.csv ... into")
    gen.set_defaults(func=cmd_trace_generate)
    val = trace.add_parser("validate", help="check trace CSV files")
    val.add_argument("files", nargs="+", type=Path)
    val.set_defaults(func=cmd_trace_validate)
    stats = trace.add_parser("stats", help="print a trace's statistics as JSON")
    stats.add_argument("file", type=Path)
    stats.set_defaults(func=cmd_trace_stats)

    sim = sub.add_parser("simulate", help="run one trace under one policy; prints metrics as JSON")
    sim.add_argument("--trace", type=Path, required=True)
    sim.add_argument("--policy", required=True, help=f"{', '.join(policy_names())}, or module:Class / file.py:Class")
    sim.add_argument("--jobs-out", type=Path, default=None, help="write per-job JCTs to this CSV")
    _add_scenario_args(sim)
    sim.set_defaults(func=cmd_simulate)

    cmp = sub.add_parser("compare", help="all policies over a set of traces; prints a table")
    cmp.add_argument("traces", nargs="+", type=Path, help="trace files or folders of them")
    cmp.add_argument("--policies", nargs="+", default=list(policy_names()))
    cmp.add_argument("--out", type=Path, default=None, help="write the tidy per-(trace, policy) table to this CSV")
    cmp.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_scenario_args(cmp)
    cmp.set_defaults(func=cmd_compare)

    stage = sub.add_parser("stage", help="run one pipeline stage's notebook (what dvc repro calls)")
    stage.add_argument("stage", help="a stage of dvc.yaml: traces, baselines, report, pretrain, finetune, evaluate, "
                                     "ablate@GROUP (learner, model, environment), reproduction, reproduction-published")
    stage.add_argument("--params", type=Path, default=None)
    stage.add_argument("--data-dir", type=Path, default=None)
    stage.set_defaults(func=cmd_stage)

    publish = sub.add_parser("publish", help="copy an ablate stage's full-scale axes, or a kind testbed run, into data/published")
    publish.add_argument("--group", default=None, help="the ablation group whose last run to publish (params.yaml ablations.groups)")
    publish.add_argument("--testbed", action="store_true", help="the last pipeline run on kind (finetune.backend: kind)")
    publish.add_argument("--data-dir", type=Path, default=None)
    publish.set_defaults(func=cmd_publish)

    bench = sub.add_parser("bench", help="measure simulator speed (or, with --ray, the Ray executor); writes JSON")
    bench.add_argument("--out", type=Path, default=None, help="the JSON file (default bench.json, or bench-ray.json with --ray)")
    bench.add_argument("--repeats", type=int, default=20)
    bench.add_argument("--no-learn", action="store_true", help="skip the learning benchmark (rollouts, latency, pretraining)")
    bench.add_argument("--ray", action="store_true", help="instead: a reduced ablation group in-process and on 1 and 2 local "
                                                          "Ray nodes (speedup, overhead per task, equality)")
    bench.set_defaults(func=cmd_bench)

    from dl2.k8s.cli import add_parsers as add_kubernetes_parsers

    add_kubernetes_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
        sys.stdout.flush()
    except Dl2Error as exc:
        print(f"dl2: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`dl2 compare ... | head`): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
