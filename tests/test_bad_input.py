"""Bad input: every command prints ONE line `dl2: error: ...` naming the file and line (rows) or the key
(params), exits 2, and writes no partial output."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dl2.cli import main
from dl2.errors import Dl2Error
from dl2.stages import load_stage
from dl2.workload.presets import get_preset, load_presets

PROJECT_PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
HEADER = "job_id,arrival_slot,model,num_epochs"
GOOD_ROWS = ["1,0,resnet-50,10", "2,0,vgg-16,20", "3,1,resnet-50,5"]


# ---------------------------------------------------------------- helpers


def write_trace(tmp_path: Path, lines: list[str], name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def good_trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, [HEADER, *GOOD_ROWS], "good.csv")


def run_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI, expect exit 2, nothing on stdout, one `dl2: error:` line on stderr; return that line."""
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, f"exit code {code}, stderr: {captured.err!r}"
    assert captured.out == "", f"partial output on stdout: {captured.out!r}"
    lines = captured.err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {captured.err!r}"
    assert lines[0].startswith("dl2: error: "), lines[0]
    return lines[0]


def trace_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path) -> list[str]:
    """The error of `trace` through `trace validate`, `trace stats` and `simulate --jobs-out` (no output file)."""
    messages = [run_error(capsys, ["trace", "validate", str(trace)]), run_error(capsys, ["trace", "stats", str(trace)])]
    jobs_out = tmp_path / "out" / "jobs.csv"
    messages.append(run_error(capsys, ["simulate", "--trace", str(trace), "--policy", "fifo", "--jobs-out", str(jobs_out)]))
    assert not jobs_out.exists(), "--jobs-out written for a bad trace"
    assert not jobs_out.parent.exists() or not any(jobs_out.parent.iterdir()), "temporary output left behind"
    assert len(set(messages)) == 1, f"commands disagree on the error: {messages}"
    return messages


def assert_names_line(messages: list[str], trace: Path, line: int, *words: str) -> None:
    for msg in messages:
        assert f"{trace}:{line}:" in msg, f"file and line {trace}:{line} not named in {msg!r}"
        for word in words:
            assert word in msg, f"{word!r} not in {msg!r}"


def assert_names_file(messages: list[str], trace: Path, *words: str) -> None:
    for msg in messages:
        assert str(trace) in msg, f"file {trace} not named in {msg!r}"
        for word in words:
            assert word in msg, f"{word!r} not in {msg!r}"


def params_file(tmp_path: Path, change: Callable[[dict[str, Any]], None], name: str = "params.yaml") -> Path:
    """A copy of the project's params.yaml with one change."""
    params = yaml.safe_load(PROJECT_PARAMS.read_text())
    change(params)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def simulate_with_params(capsys: pytest.CaptureFixture[str], tmp_path: Path, params: Path) -> str:
    jobs_out = tmp_path / "jobs.csv"
    msg = run_error(capsys, ["simulate", "--params", str(params), "--preset", "paper", "--trace", str(good_trace(tmp_path)),
                             "--policy", "fifo", "--jobs-out", str(jobs_out)])
    assert not jobs_out.exists()
    return msg


def set_key(*keys_and_value: Any) -> Callable[[dict[str, Any]], None]:
    *keys, value = keys_and_value

    def change(params: dict[str, Any]) -> None:
        node = params
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return change


def stage_error(stage: str, params: Path) -> str:
    with pytest.raises(Dl2Error) as info:
        load_stage(stage, params)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- the project's own params are valid


def test_project_params_are_valid_baseline():
    """The unchanged copy is accepted, so each failure below is due to its one change."""
    assert set(load_presets(PROJECT_PARAMS)) >= {"paper", "dev"}
    assert load_stage("traces", PROJECT_PARAMS).config.traces.num_traces > 0
    assert load_stage("baselines", PROJECT_PARAMS).config.baselines.policies


# ---------------------------------------------------------------- malformed traces


def test_trace_missing_column(capsys, tmp_path):
    trace = write_trace(tmp_path, ["job_id,arrival_slot,model", "1,0,resnet-50", "2,0,vgg-16"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 1, "num_epochs")


def test_trace_unknown_model(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10", "2,0,alexnet-9000,10", "3,0,vgg-16,10"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 3, "model", "alexnet-9000")


def test_trace_negative_epochs(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10", "2,0,vgg-16,-5"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 3, "num_epochs", "-5")


def test_trace_zero_epochs(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,0"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 2, "num_epochs")


def test_trace_nan_epochs(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10", "2,0,vgg-16,10", "3,0,vgg-16,nan"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 4, "num_epochs")


def test_trace_non_numeric_epochs(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,lots"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 2, "num_epochs", "lots")


def test_trace_duplicate_job_id(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10", "2,0,vgg-16,10", "1,3,vgg-16,10"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 4, "job_id", "duplicate")


def test_trace_fractional_arrival_slot(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10", "2,1.5,vgg-16,10"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 3, "arrival_slot", "1.5")


def test_trace_text_arrival_slot(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,abc,resnet-50,10"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 2, "arrival_slot", "abc")


def test_trace_negative_arrival_slot(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10", "2,-1,vgg-16,10"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 3, "arrival_slot", "-1")


def test_trace_zero_job_id(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "0,0,resnet-50,10"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 2, "job_id")


def test_trace_empty_file(capsys, tmp_path):
    trace = tmp_path / "empty.csv"
    trace.write_text("")
    assert_names_file(trace_error(capsys, tmp_path, trace), trace, "empty")


def test_trace_whitespace_only_file(capsys, tmp_path):
    trace = tmp_path / "blank.csv"
    trace.write_text("\n   \n\n")
    assert_names_file(trace_error(capsys, tmp_path, trace), trace, "empty")


def test_trace_binary_file(capsys, tmp_path):
    trace = tmp_path / "image.csv"
    trace.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00\x10")
    assert_names_file(trace_error(capsys, tmp_path, trace), trace)


def test_trace_json_blob(capsys, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text('{"jobs": [{"id": 1, "model": "resnet-50", "epochs": 10}]}\n')
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 1, "missing column")


def test_trace_single_column_garbage(capsys, tmp_path):
    trace = write_trace(tmp_path, ["lorem ipsum", "dolor sit amet", "consectetur"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 1, "missing column")


def test_trace_row_with_too_few_fields(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10", "2,0,vgg-16"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 3, "4 fields", "got 3")


def test_trace_row_with_too_many_fields(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER, "1,0,resnet-50,10,surprise"])
    assert_names_line(trace_error(capsys, tmp_path, trace), trace, 2, "4 fields", "got 5")


def test_trace_header_only(capsys, tmp_path):
    trace = write_trace(tmp_path, [HEADER])
    assert_names_file(trace_error(capsys, tmp_path, trace), trace, "no jobs")


def test_trace_nonexistent_file(capsys, tmp_path):
    trace = tmp_path / "nope" / "missing.csv"
    assert_names_file(trace_error(capsys, tmp_path, trace), trace, "not found")


def test_trace_that_is_a_folder(capsys, tmp_path):
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    assert_names_file(trace_error(capsys, tmp_path, folder), folder)


def test_trace_line_numbers_are_physical_lines_after_a_quoted_newline(capsys, tmp_path):
    """A quoted field spanning two lines: the bad row after it is on line 4 of the file."""
    trace = write_trace(tmp_path, [HEADER, '1,0,"resnet', '-50",10', "2,0,vgg-16,-1"])
    msg = run_error(capsys, ["trace", "validate", str(trace)])
    # Either the split model name is rejected on line 2, or the negative epochs are reported on line 4.
    assert f"{trace}:2:" in msg or f"{trace}:4:" in msg, msg


def test_compare_with_bad_trace_writes_no_out(capsys, tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    good_trace(folder)
    bad = write_trace(folder, [HEADER, "1,0,resnet-50,10", "2,0,vgg-16,0"], "z_bad.csv")
    out = tmp_path / "summary.csv"
    msg = run_error(capsys, ["compare", str(folder), "--quiet", "--out", str(out), "--policies", "fifo"])
    assert f"{bad}:3:" in msg and "num_epochs" in msg
    assert not out.exists()


def test_compare_with_empty_folder(capsys, tmp_path):
    folder = tmp_path / "none"
    folder.mkdir()
    out = tmp_path / "summary.csv"
    msg = run_error(capsys, ["compare", str(folder), "--quiet", "--out", str(out)])
    assert str(folder) in msg
    assert not out.exists()


# ---------------------------------------------------------------- unknown policy, unknown preset


def test_simulate_unknown_policy(capsys, tmp_path):
    jobs_out = tmp_path / "jobs.csv"
    msg = run_error(capsys, ["simulate", "--trace", str(good_trace(tmp_path)), "--policy", "lottery", "--jobs-out", str(jobs_out)])
    assert "unknown policy 'lottery'" in msg and "fifo" in msg
    assert not jobs_out.exists()


def test_compare_unknown_policy(capsys, tmp_path):
    out = tmp_path / "summary.csv"
    msg = run_error(capsys, ["compare", str(good_trace(tmp_path)), "--quiet", "--out", str(out), "--policies", "fifo", "lottery"])
    assert "unknown policy 'lottery'" in msg
    assert not out.exists()


@pytest.mark.parametrize("stage, keys, value", [("baselines", ("baselines", "policies"), ["fifo", "lottery"]),
                                               ("evaluate", ("evaluate", "heuristics"), ["lottery"]),
                                               ("evaluate", ("evaluate", "testbed_heuristics"), ["lottery"]),
                                               ("pretrain", ("pretrain", "teacher"), "lottery"),
                                               ("pollux-baselines", ("pollux", "policies"), ["lottery"])])
def test_a_policy_setting_is_refused_with_the_one_text_naming_its_key(tmp_path, stage, keys, value):
    """Every setting that names a policy is checked by `check_policy`: the same words, its key, what is known."""
    from dl2.pollux.policies import POLICIES as POLLUX_POLICIES
    from dl2.schedulers.builtin import BUILTIN_POLICIES
    from dl2.schedulers.names import check_policy

    params = params_file(tmp_path, set_key(*keys, value))
    msg = stage_error(stage, params)
    pollux = stage == "pollux-baselines"
    builtin, world, classes = (POLLUX_POLICIES, "pollux", False) if pollux else (BUILTIN_POLICIES, "", stage == "baselines")
    with pytest.raises(Dl2Error) as expected:
        check_policy("lottery", builtin, classes=classes, world=world, key=".".join(keys))
    assert msg == f"{params}: {expected.value}" and "unknown policy 'lottery'" in msg


def test_every_command_refuses_a_policy_name_with_the_one_text():
    from dl2.pollux.policies import make_policy
    from dl2.schedulers.builtin import BUILTIN_POLICIES, simulate_builtin
    from dl2.schedulers.names import check_policy
    from dl2.schedulers.registry import get_scheduler

    def refusal(run) -> str:
        with pytest.raises(Dl2Error) as info:
            run()
        return str(info.value)

    known = "fifo, srtf, drf, tetris, optimus"
    assert refusal(lambda: get_scheduler("lottery")) == f"unknown policy 'lottery' (known: {known}, or module:Class)"
    assert refusal(lambda: simulate_builtin(None, "lottery", None)) == f"unknown policy 'lottery' (known: {known})"
    assert refusal(lambda: make_policy("drf")) == \
        "unknown policy 'drf' of the pollux world (known: optimus, tiresias, pollux, or module:Class)"
    assert refusal(lambda: get_scheduler("model.pt")).startswith("unknown policy 'model.pt'")  # a saved model loads through dl2.backends
    with_models = dict(classes=True, models=True)  # as a backend runs a policy: a saved DL2 model too
    assert check_policy("runs/sl-rl-s0.PT", BUILTIN_POLICIES, **with_models) == "runs/sl-rl-s0.PT"
    assert refusal(lambda: check_policy("lottery", BUILTIN_POLICIES, **with_models)) == \
        f"unknown policy 'lottery' (known: {known}, module:Class, or a saved DL2 model *.pt)"


def test_a_builtin_policy_is_named_in_any_case_and_runs_as_its_owner_spells_it(tmp_path):
    from dl2.pollux.policies import make_policy
    from dl2.schedulers.registry import get_scheduler

    params = params_file(tmp_path, lambda p: (p["baselines"].update(policies=["DRF", "Optimus"]), p["pretrain"].update(teacher="FIFO")))
    assert load_stage("baselines", params).config.baselines.policies == ("drf", "optimus")
    assert load_stage("pretrain", params).config.pretrain.teacher == "fifo"
    assert get_scheduler("SRTF").name == "srtf" and make_policy("Tiresias").name == make_policy("tiresias").name


def test_a_backend_name_is_refused_with_the_one_text_by_every_stage_that_reads_it(tmp_path):
    from dl2.learn.settings import check_backend

    params = params_file(tmp_path, set_key("finetune", "backend", "slurm"))
    with pytest.raises(Dl2Error) as expected:
        check_backend("slurm")
    assert str(expected.value) == "finetune.backend: expected one of sim, k8s, kind, got 'slurm'"
    assert stage_error("finetune", params) == stage_error("evaluate", params) == f"{params}: {expected.value}"
    cell = stage_error("ablate@learner", params)  # the first cell that reads it
    assert cell.startswith(f"{params}: ablations.axes.") and cell.endswith(f": {expected.value}")


def test_simulate_scheduler_file_not_found(capsys, tmp_path):
    missing = tmp_path / "nowhere.py"
    msg = run_error(capsys, ["simulate", "--trace", str(good_trace(tmp_path)), "--policy", f"{missing}:Sched"])
    assert str(missing) in msg


def test_simulate_scheduler_class_not_in_file(capsys, tmp_path):
    sched = tmp_path / "sched.py"
    sched.write_text("class Other:\n    name = 'other'\n")
    msg = run_error(capsys, ["simulate", "--trace", str(good_trace(tmp_path)), "--policy", f"{sched}:Sched"])
    assert str(sched) in msg and "'Sched'" in msg


def test_simulate_scheduler_without_schedule_method(capsys, tmp_path):
    sched = tmp_path / "sched.py"
    sched.write_text("class Sched:\n    name = 'lazy'\n")
    msg = run_error(capsys, ["simulate", "--trace", str(good_trace(tmp_path)), "--policy", f"{sched}:Sched"])
    assert "schedule" in msg


def test_simulate_scheduler_file_with_syntax_error(capsys, tmp_path):
    """A user's scheduler file that does not parse is bad input: one line naming the file and line, exit 2."""
    sched = tmp_path / "broken.py"
    sched.write_text("import numpy as np\n\ndef schedule(:\n    pass\n")
    jobs_out = tmp_path / "jobs.csv"
    msg = run_error(capsys, ["simulate", "--trace", str(good_trace(tmp_path)), "--policy", f"{sched}:Sched",
                             "--jobs-out", str(jobs_out)])
    assert str(sched) in msg and "3" in msg
    assert not jobs_out.exists()


def test_simulate_unknown_speed_model(capsys, tmp_path):
    msg = run_error(capsys, ["simulate", "--trace", str(good_trace(tmp_path)), "--policy", "fifo", "--speed-model", "magic"])
    assert "--speed-model" in msg and "magic" in msg


def test_simulate_unknown_preset(capsys, tmp_path):
    jobs_out = tmp_path / "jobs.csv"
    msg = run_error(capsys, ["simulate", "--trace", str(good_trace(tmp_path)), "--policy", "fifo", "--preset", "huge",
                             "--jobs-out", str(jobs_out)])
    assert "unknown preset 'huge'" in msg and "paper" in msg
    assert not jobs_out.exists()


def test_trace_generate_unknown_preset(capsys, tmp_path):
    out = tmp_path / "traces"
    msg = run_error(capsys, ["trace", "generate", "--preset", "huge", "--num", "2", "--out", str(out)])
    assert "unknown preset 'huge'" in msg
    assert not out.exists()


def test_get_preset_unknown_name():
    with pytest.raises(Dl2Error, match=r"unknown preset 'huge' \(known: .*paper"):
        get_preset("huge", PROJECT_PARAMS)


# ---------------------------------------------------------------- trace generate


def test_trace_generate_num_zero_creates_nothing(capsys, tmp_path):
    out = tmp_path / "gen" / "traces"
    msg = run_error(capsys, ["trace", "generate", "--num", "0", "--out", str(out)])
    assert "num" in msg and "0" in msg
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_trace_generate_negative_num_creates_nothing(capsys, tmp_path):
    out = tmp_path / "traces"
    run_error(capsys, ["trace", "generate", "--num", "-2", "--out", str(out)])
    assert not out.exists()


def test_trace_generate_unknown_arrivals_leaves_nothing(capsys, tmp_path):
    out = tmp_path / "traces"
    msg = run_error(capsys, ["trace", "generate", "--num", "2", "--arrivals", "weird", "--out", str(out)])
    assert "weird" in msg
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [], f"staging left behind: {list(tmp_path.iterdir())}"


def test_trace_generate_unknown_lengths_keeps_existing_folder(capsys, tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    (out / "trace_000.csv").write_text("old\n")
    msg = run_error(capsys, ["trace", "generate", "--num", "2", "--lengths", "weird", "--out", str(out)])
    assert "weird" in msg
    assert [p.name for p in out.iterdir()] == ["trace_000.csv"]
    assert (out / "trace_000.csv").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces"]


# ---------------------------------------------------------------- params: presets (reached by the CLI)


def test_params_negative_num_nodes(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "num_nodes", -3))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.num_nodes" in msg and "-3" in msg


def test_params_zero_max_tasks(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "max_tasks", 0))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.max_tasks" in msg


def test_params_string_num_jobs(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "num_jobs", "sixty"))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.num_jobs" in msg and "sixty" in msg


def test_params_bool_num_nodes(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "num_nodes", True))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.num_nodes" in msg


def test_params_float_max_epochs(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "max_epochs", 2.5))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.max_epochs" in msg


def test_params_unknown_speed_table(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "speed_table", "nope"))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.speed_table" in msg and "nope" in msg


def test_params_non_bool_bucket_to_model(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "bucket_to_model", "sometimes"))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.bucket_to_model" in msg


def test_params_zero_slot_seconds(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "slot_seconds", 0))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.slot_seconds" in msg


def test_params_bad_value_in_another_preset(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "dev", "num_nodes", -3))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.dev.num_nodes" in msg


def test_params_missing_preset_key(capsys, tmp_path):
    params = params_file(tmp_path, lambda p: p["presets"]["paper"].pop("num_jobs"))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper.num_jobs" in msg and "missing" in msg


def test_params_unknown_preset_key(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "gpus_per_node", 4))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper" in msg and "gpus_per_node" in msg


def test_params_preset_not_a_mapping(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", [1, 2, 3]))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets.paper" in msg


def test_params_missing_presets_section(capsys, tmp_path):
    params = params_file(tmp_path, lambda p: p.pop("presets"))
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "presets" in msg


def test_params_not_yaml(capsys, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("presets:\n  paper: [num_nodes: 96\n\tmax_tasks: {8\n")
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "YAML" in msg


def test_params_yaml_that_is_not_a_mapping(capsys, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("- just\n- a list\n")
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "mapping" in msg


def test_params_binary_file(capsys, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00")
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg


def test_params_file_not_found(capsys, tmp_path):
    params = tmp_path / "missing.yaml"
    msg = simulate_with_params(capsys, tmp_path, params)
    assert str(params) in msg and "not found" in msg


def test_params_bad_preset_for_trace_generate(capsys, tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "max_tasks", 0))
    out = tmp_path / "traces"
    msg = run_error(capsys, ["trace", "generate", "--params", str(params), "--num", "2", "--out", str(out)])
    assert "presets.paper.max_tasks" in msg
    assert not out.exists()


def test_load_presets_reports_key_directly(tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "num_nodes", -3))
    with pytest.raises(Dl2Error, match=r"presets\.paper\.num_nodes.*-3"):
        load_presets(params)
    with pytest.raises(Dl2Error, match=r"presets\.paper\.num_nodes"):
        get_preset("paper", params)


# ---------------------------------------------------------------- params: pipeline stages (load_stage)


def test_params_traces_num_traces_zero(tmp_path):
    params = params_file(tmp_path, set_key("traces", "num_traces", 0))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces.num_traces" in msg and "0" in msg


def test_params_traces_num_traces_string(tmp_path):
    params = params_file(tmp_path, set_key("traces", "num_traces", "ten"))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces.num_traces" in msg


def test_params_traces_negative_seed(tmp_path):
    params = params_file(tmp_path, set_key("traces", "seed", -1))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces.seed" in msg


def test_params_traces_missing_seed(tmp_path):
    params = params_file(tmp_path, lambda p: p["traces"].pop("seed"))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces.seed" in msg and "missing" in msg


def test_params_traces_weird_arrivals(tmp_path):
    params = params_file(tmp_path, set_key("traces", "arrivals", "weird"))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces.arrivals" in msg and "weird" in msg


def test_params_traces_weird_lengths(tmp_path):
    params = params_file(tmp_path, set_key("traces", "lengths", "weird"))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces.lengths" in msg


def test_params_traces_unknown_preset(tmp_path):
    params = params_file(tmp_path, set_key("traces", "presets", ["paper", "huge"]))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces.presets" in msg and "huge" in msg


def test_params_traces_section_missing(tmp_path):
    params = params_file(tmp_path, lambda p: p.pop("traces"))
    msg = stage_error("traces", params)
    assert str(params) in msg and "traces" in msg


def test_params_baselines_unknown_policy(tmp_path):
    params = params_file(tmp_path, set_key("baselines", "policies", ["fifo", "lottery", "srtf"]))
    msg = stage_error("baselines", params)
    assert str(params) in msg and "baselines.policies" in msg and "lottery" in msg


def test_params_baselines_non_bool_fine_grained_jct(tmp_path):
    params = params_file(tmp_path, set_key("baselines", "fine_grained_jct", "sometimes"))
    msg = stage_error("baselines", params)
    assert str(params) in msg and "baselines.fine_grained_jct" in msg and "sometimes" in msg


def test_params_baselines_int_fine_grained_jct(tmp_path):
    params = params_file(tmp_path, set_key("baselines", "fine_grained_jct", 1))
    msg = stage_error("baselines", params)
    assert str(params) in msg and "baselines.fine_grained_jct" in msg


def test_params_baselines_missing_policies(tmp_path):
    params = params_file(tmp_path, lambda p: p["baselines"].pop("policies"))
    msg = stage_error("baselines", params)
    assert str(params) in msg and "baselines.policies" in msg and "missing" in msg


def test_params_report_bad_figure_dpi(tmp_path):
    params = params_file(tmp_path, set_key("report", "figure_dpi", 5000))
    msg = stage_error("report", params)
    assert str(params) in msg and "report.figure_dpi" in msg and "5000" in msg


def test_params_stage_sees_bad_preset(tmp_path):
    params = params_file(tmp_path, set_key("presets", "paper", "speed_table", "nope"))
    msg = stage_error("traces", params)
    assert str(params) in msg and "presets.paper.speed_table" in msg


def test_unknown_stage(tmp_path):
    with pytest.raises(Dl2Error, match="unknown stage 'train'"):
        load_stage("train", PROJECT_PARAMS)


def test_stage_command_rejects_bad_params_before_running(capsys, tmp_path, monkeypatch):
    """`dl2 stage` checks the params before it opens a tracking run or a notebook."""
    import dl2.notebooks
    import dl2.stages

    def must_not_run(*args, **kwargs):
        raise AssertionError("stage went past the parameter check")

    monkeypatch.setattr(dl2.stages, "create_stage_run", must_not_run)
    monkeypatch.setattr(dl2.notebooks, "execute", must_not_run)
    params = params_file(tmp_path, set_key("traces", "num_traces", 0))
    data = tmp_path / "data"
    msg = run_error(capsys, ["stage", "traces", "--params", str(params), "--data-dir", str(data)])
    assert str(params.resolve()) in msg and "traces.num_traces" in msg
    assert not data.exists()


def test_no_stray_files_in_cwd(tmp_path, capsys, monkeypatch):
    """Errors with relative paths write nothing into the working folder."""
    monkeypatch.chdir(tmp_path)
    Path("bad.csv").write_text(HEADER + "\n1,0,resnet-50,-1\n")
    msg = run_error(capsys, ["simulate", "--trace", "bad.csv", "--policy", "fifo", "--jobs-out", "jobs.csv"])
    assert "bad.csv:2:" in msg
    assert sorted(os.listdir(tmp_path)) == ["bad.csv"]


def test_a_stage_dvc_yaml_does_not_have_is_named_with_the_ones_it_has(capsys, tmp_path):
    data = tmp_path / "data"
    msg = run_error(capsys, ["stage", "ablate@everything", "--data-dir", str(data)])
    assert "unknown stage 'ablate@everything'" in msg and "ablate@learner" in msg and "reproduction-published" in msg
    assert not data.exists()


@pytest.mark.parametrize("counts", [["0"], ["1", "4096"]])
def test_bench_clusters_refuses_counts_the_machine_cannot_give_a_cpu_each(capsys, tmp_path, counts):
    out = tmp_path / "bench-clusters.json"
    message = run_error(capsys, ["bench", "--clusters", "--counts", *counts, "--out", str(out)])
    assert "--counts" in message and "CPUs" in message
    assert not out.exists()


def test_bench_runs_one_benchmark_at_a_time(capsys):
    assert "one at a time" in run_error(capsys, ["bench", "--ray", "--clusters"])
