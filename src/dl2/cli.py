"""The `dl2` command: one subcommand per user-facing action. Errors print one line and exit 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dl2.errors import Dl2Error


def _world(args: argparse.Namespace):
    """The preset `--preset` names, its world, and the PS/worker simulator's options (flags a Pollux-world preset
    refuses, since its simulator has none of them)."""
    from dl2.sim.scenario import SPEED_MODELS, SimOptions
    from dl2.workload.presets import PS_WORKER, get_preset
    from dl2.worlds import world_of

    preset = get_preset(args.preset, args.params)
    if preset.world != PS_WORKER:
        given = [flag for flag, on in (("--integer-jct", args.integer_jct), ("--assign-bundle", args.assign_bundle),
                                       ("--speed-model", args.speed_model != "measured")) if on]
        if given:
            raise Dl2Error(f"{given[0]}: an option of the ps-worker world's simulator; "
                           f"preset {preset.name!r} is of the {preset.world} world")
    if args.speed_model not in SPEED_MODELS:
        raise Dl2Error(f"--speed-model: expected one of {SPEED_MODELS}, got {args.speed_model!r}")
    options = SimOptions(fine_grained_jct=not args.integer_jct, assign_bundle=args.assign_bundle, speed_model=args.speed_model)
    return preset, world_of(preset), options


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="paper", help="a preset of the params file, of any world (default: paper)")
    p.add_argument("--params", type=Path, default=None, help="params file with the presets (default: the project's params.yaml)")
    p.add_argument("--integer-jct", action="store_true", help="ps-worker: count the last slot whole (default: fine-grained JCT)")
    p.add_argument("--assign-bundle", action="store_true", help="ps-worker: give every job one bundle before the policy acts")
    p.add_argument("--speed-model", default="measured", help="ps-worker: measured (default) or analytical")


def cmd_trace_generate(args: argparse.Namespace) -> None:
    from dl2.workload.presets import PS_WORKER, get_preset

    preset = get_preset(args.preset, args.params)
    if preset.world == PS_WORKER:
        from dl2.compare import generate_trace_set

        stats = generate_trace_set(preset, args.num, args.seed, args.out, args.arrivals, args.lengths)
    else:
        from dl2.pollux.philly import write_workloads

        stats = write_workloads(args.out, args.num, args.seed, args.jobs, args.start_hour, args.hours)
    print(stats.to_string(index=False))


def _trace_preset(args: argparse.Namespace):
    """`--preset` in `--params` (the world that reads the trace files)."""
    from dl2.workload.presets import get_preset

    return get_preset(args.preset, args.params)


def cmd_trace_validate(args: argparse.Namespace) -> None:
    from dl2.worlds import world_of

    world = world_of(_trace_preset(args))
    for path in args.files:
        print(f"{path}: ok, {len(world.read_trace(path))} jobs")


def cmd_trace_stats(args: argparse.Namespace) -> None:
    from dl2.metrics import bound_reach
    from dl2.sim.scenario import Scenario
    from dl2.workload.traces import Trace
    from dl2.worlds import world_of

    preset = _trace_preset(args)
    trace = world_of(preset).read_trace(args.file)
    stats = trace.stats()
    if isinstance(trace, Trace):  # the PS/worker world: the lower bound, and whether the cluster can hold its schedule
        stats["bound"] = bound_reach(trace, Scenario(preset))
    print(json.dumps(stats, indent=2))


def cmd_simulate(args: argparse.Namespace) -> None:
    from dl2.paths import write_csv_atomic

    preset, world, options = _world(args)
    result = world.compare([args.trace], [args.policy], preset, (args.seed,), options, progress=False)
    keys = ["preset", "trace", "policy", "seed"]
    if args.jobs_out:
        write_csv_atomic(args.jobs_out, result.jobs.drop(columns=[k for k in keys if k in result.jobs]))
    row = {k: v.item() if hasattr(v, "item") else v for k, v in result.summary.iloc[0].items()}
    summary = {k: v for k, v in row.items() if k not in keys}
    print(json.dumps({"policy": row["policy"], "preset": preset.name, **summary}, indent=2))


def cmd_bound_tightness(args: argparse.Namespace) -> None:
    from dl2.bound_tightness import bound_report

    report = bound_report(args.out, args.traces, args.evaluations, args.seed, args.published)
    small = {name: {k: v for k, v in r.items() if k.startswith(("mean", "max"))} for name, r in report["small"]["presets"].items()}
    print(json.dumps({name: r["ratio_to_capacity_bound"] for name, r in report["published"].items()} | small, indent=2))


def cmd_compare(args: argparse.Namespace) -> None:
    import pandas as pd

    from dl2.compare import trace_files
    from dl2.paths import write_csv_atomic

    preset, world, options = _world(args)
    files = [f for t in args.traces for f in trace_files(t)]
    result = world.compare(files, args.policies or list(world.policies), preset, tuple(args.seeds), options, progress=not args.quiet)
    if args.out:
        write_csv_atomic(args.out, result.summary)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(world.aggregate(result.summary).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def cmd_score(args: argparse.Namespace) -> None:
    from dl2.score.command import score, score_builtins

    if args.builtins == (args.scheduler is not None):
        raise Dl2Error("name a SCHEDULER to score, or --builtins to publish the built-ins' scoreboard (not both)")
    if args.builtins:
        print(score_builtins(args.out, progress=not args.quiet))
        return
    print(score(args.scheduler, args.out, args.seeds, kind=args.kind, kind_folder=args.kind_folder,
                progress=not args.quiet))


def cmd_stage(args: argparse.Namespace) -> None:
    from dl2.bench_pipeline import record_stage_usage
    from dl2.stages import run_stage

    print(run_stage(args.stage, args.params, args.data_dir))
    record_stage_usage(args.stage)  # for `dl2 bench --pipeline`, when it asks


def cmd_publish(args: argparse.Namespace) -> None:
    from dl2.paths import repo_root
    from dl2.publish import publish_ablations, publish_pollux, publish_pollux_table, publish_testbed

    data_dir = (args.data_dir or repo_root() / "data").resolve()
    if [args.testbed, args.pollux, args.pollux_table, args.group is not None].count(True) != 1:
        raise Dl2Error("say what to publish: --group GROUP (an ablate stage's axes), --testbed (a kind testbed run), "
                       "--pollux (the Pollux world's full grid) or --pollux-table (DL2's table beside it)")
    if args.pollux or args.pollux_table:
        files = publish_pollux(data_dir) if args.pollux else publish_pollux_table(data_dir)
        print(f"published {len(files)} files into {data_dir / 'published' / 'pollux'}")
        return
    if args.testbed:
        files = publish_testbed(data_dir)
        print(f"published {len(files)} files into {data_dir / 'published' / 'testbed'}")
        return
    axes = publish_ablations(data_dir, args.group)
    print(f"published {', '.join(axes)} into {data_dir / 'published' / 'ablations'} (ablate-{args.group}.json)")


POLLUX_TRAIN_FLAGS = ("teacher", "variant", "window", "assign_one", "train_load", "train_seeds", "sl_epochs", "dagger_rounds",
                      "ppo_updates", "num_envs", "rollout_length", "eval_loads", "eval_workloads")  # PolluxTrainSettings keys, as --flags


def cmd_pollux_train(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from dl2.learn.pollux import runs
    from dl2.paths import write_csv_atomic
    from dl2.pollux import table
    from dl2.pollux.grid import load_name
    from dl2.stages import load_stage

    config = load_stage("pollux-dl2", args.params, {"pollux_dl2": {"scale": args.scale}} if args.scale else None).config
    changes = {key: getattr(args, key) for key in POLLUX_TRAIN_FLAGS if getattr(args, key) is not None}
    base = config.settings[0]
    try:
        changes["eval_loads"] = tuple(load_name(x) for x in changes.get("eval_loads", base.eval_loads))
    except Dl2Error as exc:
        raise Dl2Error(f"--eval-loads: {exc}") from None
    variants = [changes.pop("variant")] if "variant" in changes else [s.variant for s in config.settings]
    try:
        changed = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}
        settings = [replace(base, variant=variant, **changed) for variant in variants]
    except Dl2Error as exc:  # the settings name the key: name its flag
        key, _, why = str(exc).partition(": ")
        raise Dl2Error(f"--{key.replace('_', '-')}: {why}" if key in POLLUX_TRAIN_FLAGS else str(exc)) from None
    seeds = tuple(args.seed) if args.seed else config.seeds
    if any(seed < 0 for seed in seeds):
        raise Dl2Error(f"--seed: expected seeds >= 0, got {list(seeds)}")
    results = runs.train_runs(settings, config.preset, seeds, args.out / "runs", progress=not args.quiet)
    summary = runs.summary(results)
    write_csv_atomic(args.out / "summary.csv", summary)
    built = runs.beside_baselines(summary, config.preset, config.pollux_dl2.scale)
    table.write(built, args.out)
    print(built.markdown())


SEPARATE_BENCHMARKS = {  # flag: (module, function, default output); each function takes the output path
    "bound": ("dl2.bench_bound", "bound_benchmark", "bench-bound.json"),
    "score": ("dl2.bench_score", "score_benchmark", "bench-score.json"),
    "pipeline": ("dl2.bench_pipeline", "pipeline_benchmark", "bench-pipeline.json"),
    "clusters": ("dl2.bench_clusters", "clusters_benchmark", "bench-clusters.json"),
    "pollux": ("dl2.bench_pollux", "pollux_benchmark", "bench-pollux.json"),
    "pollux_env": ("dl2.bench_pollux_env", "pollux_env_benchmark", "bench-pollux-env.json"),
    "pollux_sl": ("dl2.bench_pollux_sl", "pollux_sl_benchmark", "bench-pollux-sl.json"),
    "ray": ("dl2.bench_ray", "ray_benchmark", "bench-ray.json"),
}


def cmd_bench(args: argparse.Namespace) -> None:
    import importlib

    chosen = [flag for flag in SEPARATE_BENCHMARKS if getattr(args, flag)]
    if len(chosen) > 1:
        raise Dl2Error(f"{', '.join('--' + f.replace('_', '-') for f in SEPARATE_BENCHMARKS)} are separate benchmarks: run one at a time")
    if chosen:
        module, function, default = SEPARATE_BENCHMARKS[chosen[0]]
        benchmark = getattr(importlib.import_module(module), function)
        extra = (tuple(args.counts),) if chosen[0] == "clusters" else ()
        print(json.dumps(benchmark(args.out or Path(default), *extra), indent=2))
        return
    from dl2.bench import run_benchmark

    print(json.dumps(run_benchmark(args.out or Path("bench.json"), repeats=args.repeats, learn=not args.no_learn), indent=2))


def build_parser() -> argparse.ArgumentParser:
    from dl2.pollux.policies import POLICIES as POLLUX_POLICIES
    from dl2.schedulers import policy_names

    parser = argparse.ArgumentParser(prog="dl2", description="DL2 scheduler: traces, simulation, comparison, pipeline stages.")
    sub = parser.add_subparsers(dest="command", required=True)

    trace = sub.add_parser("trace", help="generate, validate or describe job traces").add_subparsers(dest="action", required=True)
    gen = trace.add_parser("generate", help="write a set of traces (or, for a pollux preset, workloads) for a preset")
    gen.add_argument("--preset", default="paper")
    gen.add_argument("--params", type=Path, default=None)
    gen.add_argument("--num", type=int, default=10, help="how many traces (default 10)")
    gen.add_argument("--seed", type=int, default=0, help="pollux: the first workload's seed (the artifact's workload-k is seed k)")
    gen.add_argument("--arrivals", default="ali", help="ps-worker: ali | google | poisson | uniform")
    gen.add_argument("--lengths", default="ali", help="ps-worker: ali | fixed | normal")
    gen.add_argument("--jobs", type=int, default=160, help="pollux: jobs per workload (the artifact's load 1: 160)")
    gen.add_argument("--start-hour", type=int, default=2, help="pollux: the hour of day the Philly window starts")
    gen.add_argument("--hours", type=int, default=8, help="pollux: the window's length in hours")
    gen.add_argument("--out", type=Path, required=True, help="folder to write trace_000.csv ... (pollux: workload-<seed>.csv) into")
    gen.set_defaults(func=cmd_trace_generate)
    val = trace.add_parser("validate", help="check trace CSV files (of --preset's world)")
    val.add_argument("files", nargs="+", type=Path)
    val.add_argument("--preset", default="paper", help="a preset of the traces' world (default: paper)")
    val.add_argument("--params", type=Path, default=None)
    val.set_defaults(func=cmd_trace_validate)
    stats = trace.add_parser("stats", help="print a trace's statistics as JSON")
    stats.add_argument("file", type=Path)
    stats.add_argument("--preset", default="paper", help="a preset of the trace's world (default: paper)")
    stats.add_argument("--params", type=Path, default=None)
    stats.set_defaults(func=cmd_trace_stats)

    sim = sub.add_parser("simulate", help="run one trace (or Pollux-world workload) under one policy; prints metrics as JSON")
    sim.add_argument("--trace", type=Path, required=True)
    sim.add_argument("--policy", required=True, help=f"ps-worker: {', '.join(policy_names())}; pollux: {', '.join(POLLUX_POLICIES)}; "
                                                     "or module:Class / file.py:Class")
    sim.add_argument("--seed", type=int, default=0, help="seeds a randomized policy (pollux)")
    sim.add_argument("--jobs-out", type=Path, default=None, help="write per-job JCTs to this CSV")
    _add_scenario_args(sim)
    sim.set_defaults(func=cmd_simulate)

    cmp = sub.add_parser("compare", help="all policies over a set of traces; prints a table")
    cmp.add_argument("traces", nargs="+", type=Path, help="trace files or folders of them")
    cmp.add_argument("--policies", nargs="+", default=None, help="default: the preset's world's built-in policies")
    cmp.add_argument("--seeds", nargs="+", type=int, default=[0], help="a randomized policy (pollux) runs once per seed")
    cmp.add_argument("--out", type=Path, default=None, help="write the tidy per-(trace, policy) table to this CSV")
    cmp.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_scenario_args(cmp)
    cmp.set_defaults(func=cmd_compare)

    score = sub.add_parser("score", help="score a scheduler on the fixed suite of every world it plays, ranked among the "
                                         "built-ins; writes score.json and score.md (docs/scoreboard.md)")
    score.add_argument("scheduler", nargs="?", default=None, help="a built-in policy of either world, a saved DL2 model "
                                                                  "(*.pt), or module:Class / file.py:Class")
    score.add_argument("--out", type=Path, default=None, help="folder for score.json and score.md (default: score-<name>; "
                                                             "with --builtins: data/published/scoreboard)")
    score.add_argument("--seeds", nargs="+", type=int, default=None, help="a randomized policy's seeds (default: the suite's 0 1 2)")
    score.add_argument("--kind", action="store_true", help="also replay the suite's trace on the kind testbed (dl2 testbed up --kind)")
    score.add_argument("--kind-folder", type=Path, default=None, help="the kind testbed's folder (default: dl2 testbed up's)")
    score.add_argument("--builtins", action="store_true", help="instead: score the built-ins and write the published scoreboard")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=cmd_score)

    bound = sub.add_parser("bound", help="the capacity-aware lower bound").add_subparsers(dest="action", required=True)
    tight = bound.add_parser("tightness", help="the bound on the published evaluations' validation traces beside their policies, "
                                               "and against the best schedule a search finds on small traces; writes JSON")
    tight.add_argument("--traces", type=int, default=10, help="small traces per small preset (default 10)")
    tight.add_argument("--evaluations", type=int, default=200, help="schedules the search replays per small trace (default 200)")
    tight.add_argument("--seed", type=int, default=0)
    tight.add_argument("--published", type=Path, default=Path("data/published"), help="where the published evaluations are")
    tight.add_argument("--out", type=Path, default=Path("data/published/bounds/tightness.json"))
    tight.set_defaults(func=cmd_bound_tightness)

    stage = sub.add_parser("stage", help="run one pipeline stage's notebook (what dvc repro calls)")
    stage.add_argument("stage", help="a stage of dvc.yaml: traces, baselines, report, pretrain, finetune, evaluate, "
                                     "ablate@GROUP (learner, model, environment), reproduction, reproduction-published")
    stage.add_argument("--params", type=Path, default=None)
    stage.add_argument("--data-dir", type=Path, default=None)
    stage.set_defaults(func=cmd_stage)

    ptrain = sub.add_parser("pollux-train", help="train DL2 in the Pollux world (SL on a teacher's decisions, PPO) and run it "
                                                 "greedily on the artifact's workloads beside the published baselines; "
                                                 "params.yaml's pollux_dl2 settings, changed by the flags")
    ptrain.add_argument("--params", type=Path, default=None, help="params file (default: the project's params.yaml)")
    ptrain.add_argument("--scale", choices=("reduced", "full"), default=None, help="default: the file's pollux_dl2.scale")
    ptrain.add_argument("--seed", type=int, action="append", default=None, help="a training seed (repeat for more; "
                                                                                "default: the scale's seeds)")
    ptrain.add_argument("--out", type=Path, default=Path("pollux-dl2"), help="output folder (default: pollux-dl2)")
    ptrain.add_argument("--teacher", default=None, help="optimus or tiresias")
    ptrain.add_argument("--variant", default=None, help="tuned or pollux-batch (default: the file's pollux_dl2.variants)")
    ptrain.add_argument("--window", type=int, default=None, help="jobs the agent sees and decides for")
    ptrain.add_argument("--assign-one", action=argparse.BooleanOptionalAction, default=None,
                        help="each interval first gives every window job one GPU")
    ptrain.add_argument("--train-load", type=float, default=None, help="training workloads' jobs, as the artifact's at this load")
    ptrain.add_argument("--train-seeds", type=int, nargs="+", default=None, help="the Philly generator's seeds (not 1..8)")
    ptrain.add_argument("--sl-epochs", type=int, default=None)
    ptrain.add_argument("--dagger-rounds", type=int, default=None,
                        help="rounds of SL on the teacher's labels of the learner's own states, after SL")
    ptrain.add_argument("--ppo-updates", type=int, default=None)
    ptrain.add_argument("--num-envs", type=int, default=None)
    ptrain.add_argument("--rollout-length", type=int, default=None)
    ptrain.add_argument("--eval-loads", type=float, nargs="+", default=None, help="relative loads: 0.5 1.0 1.5 2.0")
    ptrain.add_argument("--eval-workloads", type=int, nargs="+", default=None, help="the artifact's workloads: 1..8")
    ptrain.add_argument("--quiet", action="store_true", help="no progress bars")
    ptrain.set_defaults(func=cmd_pollux_train)

    publish = sub.add_parser("publish", help="copy an ablate stage's full-scale axes, a kind testbed run, or the Pollux world's "
                                             "full grid or DL2's table beside it into data/published")
    publish.add_argument("--group", default=None, help="the ablation group whose last run to publish (params.yaml ablations.groups)")
    publish.add_argument("--testbed", action="store_true", help="the last pipeline run on kind (finetune.backend: kind)")
    publish.add_argument("--pollux", action="store_true", help="the last pollux-baselines run at full scale (pollux.scale: full)")
    publish.add_argument("--pollux-table", action="store_true", help="the last pollux-dl2 run's table at full scale "
                                                                     "(pollux_dl2.scale: full), beside the published grid")
    publish.add_argument("--data-dir", type=Path, default=None)
    publish.set_defaults(func=cmd_publish)

    bench = sub.add_parser("bench", help="measure simulator speed (or, with --ray, the Ray executor; with --pollux, the Pollux "
                                         "world); writes JSON")
    bench.add_argument("--out", type=Path, default=None, help="the JSON file (default bench.json, or bench-ray.json with --ray)")
    bench.add_argument("--repeats", type=int, default=20)
    bench.add_argument("--no-learn", action="store_true", help="skip the learning benchmark (rollouts, latency, pretraining)")
    bench.add_argument("--ray", action="store_true", help="instead: a reduced ablation group in-process and on 1 and 2 local "
                                                          "Ray nodes (speedup, overhead per task, equality)")
    bench.add_argument("--bound", action="store_true", help="instead: the capacity-aware bound's solve time on one validation "
                                                            "trace of each PS/worker preset (bench-bound.json)")
    bench.add_argument("--pollux", action="store_true", help="instead: the Pollux world's job step and each of its policies "
                                                             "on the artifact's workload 6 (bench-pollux.json)")
    bench.add_argument("--pollux-env", action="store_true", help="instead: DL2's decision environment of the Pollux world, "
                                                                 "decisions and intervals per second over 16 environments "
                                                                 "(bench-pollux-env.json)")
    bench.add_argument("--pollux-sl", action="store_true", help="instead: SL pretraining of the Pollux world, one epoch with "
                                                                "minibatches cut to their filled window slots and over the "
                                                                "whole window, at windows 20 and 64 (bench-pollux-sl.json)")
    bench.add_argument("--clusters", action="store_true", help="instead: seconds per PPO update with 1 and more training "
                                                               "clusters, one Ray actor and CPU each, and the wall time to the "
                                                               "published clusters axis's target (bench-clusters.json)")
    bench.add_argument("--pipeline", action="store_true", help="instead: the main command, `uv run --locked dvc repro`, in a "
                                                               "fresh clone of this commit: wall and CPU seconds in all and per "
                                                               "stage (bench-pipeline.json)")
    bench.add_argument("--score", action="store_true", help="instead: `dl2 score` in a fresh process, for Optimus (both "
                                                            "simulated worlds) and the documented example class "
                                                            "(bench-score.json)")
    bench.add_argument("--counts", type=int, nargs="+", default=[1, 2], help="--clusters: the cluster counts (default 1 2)")
    bench.set_defaults(func=cmd_bench)

    from dl2.testbed_cli import add_parsers as add_kubernetes_parsers

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
