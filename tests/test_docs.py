"""The docs stay honest: the README stays a front door, its table of where DL2 stands is the published
metrics, its links lead somewhere, and every `dl2` command the docs show is one the command line accepts.
(`mkdocs build --strict`, in the test command, checks the links between the pages of docs/.)"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from dl2.cli import build_parser
from dl2.paths import repo_root

ROOT = repo_root()
README = ROOT / "README.md"
LINKED = [README, ROOT / "data" / "published" / "README.md"]  # markdown read on GitHub, outside the docs site
WITH_COMMANDS = [*LINKED, *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}

FENCE = re.compile(r"^```(.*?)\n(.*?)^```", re.M | re.S)  # a fenced block: its info string and its text
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, text) of every fenced code block."""
    return [(info.strip(), text) for info, text in FENCE.findall(markdown)]


def relative_links(markdown: str) -> list[str]:
    """The targets of the links outside code blocks that point into the repository (no URL scheme, no bare #anchor)."""
    prose = FENCE.sub("", markdown)
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def dl2_commands(markdown: str) -> list[list[str]]:
    """The arguments of every `dl2` command in the shell blocks of `markdown`, as the shell would split them:
    after `sudo`, `uv run [--locked]` and VAR=value, in pipelines, lists and `$(...)`, comments left out."""
    commands = []
    for language, text in fenced_blocks(markdown):
        if language not in SHELL:
            continue
        for line in text.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            for token in [*lexer, ";"]:
                if set(token) <= set("();<>|&"):  # the end of one simple command
                    while words and (words[0] in ("sudo", "uv", "run", "--locked") or re.match(r"^\w+=", words[0])):
                        words.pop(0)
                    if words[:1] == ["dl2"]:
                        commands.append(words[1:])
                    words = []
                else:
                    words.append(token)
    return commands


@cache
def parser():
    return build_parser()


def refusal(argv: list[str]) -> str | None:
    """What dl2's argument parser says against `argv`, or None when it accepts it. Only parses: runs nothing."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parser().parse_args(argv)
    except SystemExit as exit:
        return said.getvalue().strip().splitlines()[-1] if exit.code else None
    return None


def stands_table(markdown: str) -> list[list[str]]:
    """The rows of the table under the heading "## Where DL2 stands", as lists of cells."""
    section = markdown.split("## Where DL2 stands", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]  # past the header and its rule


def test_readme_is_a_front_door_of_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_ci_runs_the_readme_test_command():
    command = next(line for _, text in fenced_blocks(README.read_text()) for line in text.splitlines() if "pytest" in line)
    steps = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("uv run")]
    assert command.split(" && ")[1:] == steps


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(path):
    links = relative_links(path.read_text())
    missing = [t for t in links if not (path.parent / t.split("#")[0]).is_file()]
    assert not missing, f"{path.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_readme_table_is_the_published_metrics():
    rows = stands_table(README.read_text())
    assert len(rows) == 4
    for preset, jct, ratio, vs_optimus, vs_drf in rows:
        summary = re.search(r"\]\((data/published/[^)]+/summary\.md)\)", preset)
        assert summary, f"row {preset!r} links no published summary"
        metrics = json.loads((ROOT / Path(summary.group(1)).parent / "metrics.json").read_text())
        dl2, optimus, drf = (metrics[p]["avg_jct"] for p in ("dl2", "optimus", "drf"))
        assert jct == f"{dl2:.3f} ± {metrics['dl2']['seed_sd']:.3f}", preset
        assert ratio == f"{metrics['dl2']['ratio_to_bound']:.3f}", preset
        assert vs_optimus == f"−{100 * (1 - dl2 / optimus):.1f}%", preset
        assert vs_drf == f"−{100 * (1 - dl2 / drf):.1f}%", preset


def test_results_page_has_the_readme_table():
    without_links = [[re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell) for cell in row] for row in stands_table(README.read_text())]
    assert stands_table((ROOT / "docs" / "results.md").read_text()) == without_links


@pytest.mark.parametrize("path", WITH_COMMANDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_is_closed_and_names_its_language(path):
    """An unclosed or untagged block would hide its commands from the check below."""
    markdown = path.read_text()
    blocks = fenced_blocks(markdown)
    assert 2 * len(blocks) == len(re.findall(r"^```", markdown, re.M)), f"{path.relative_to(ROOT)}: a ``` block left open"
    assert all(language for language, _ in blocks), f"{path.relative_to(ROOT)}: a ``` block without a language"


@pytest.mark.parametrize("path", WITH_COMMANDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dl2_command_is_one_the_command_line_accepts(path):
    refused = {shlex.join(argv): refusal(argv) for argv in dl2_commands(path.read_text())}
    assert not {command: said for command, said in refused.items() if said}, f"{path.relative_to(ROOT)}"


def test_the_command_check_finds_commands_and_refuses_bad_ones():
    markdown = ("```bash\nsudo uv run --locked dl2 testbed up --kind   # a comment\n"
                "KUBECONFIG=$(uv run dl2 testbed kubeconfig) kubectl get nodes && uv run dl2 bench \\\n  --ray\n```\n"
                "```python\nimport dl2.gym_env\n```\n")
    assert dl2_commands(markdown) == [["testbed", "up", "--kind"], ["testbed", "kubeconfig"], ["bench", "--ray"]]
    assert refusal(["testbed", "up", "--kind"]) is None
    assert "unrecognized arguments: --no-such-option" in refusal(["simulate", "--trace", "t.csv", "--policy", "drf", "--no-such-option"])
    assert "invalid choice" in refusal(["no-such-command"])
    assert "required" in refusal(["simulate", "--policy", "drf"])


def test_the_link_check_sees_links_outside_code_only():
    markdown = "[a](docs/x.md#part) [b](https://example.org) [c](#here)\n```text\n[d](hidden.md)\n```\n"
    assert relative_links(markdown) == ["docs/x.md#part"]
