"""tests/docs/test_docs.py: the documentation against the tree, with no build and no models: every
Markdown link resolves (files and #anchors), every bench/results or bench/experiments path that a
file names exists, and every command in a fenced `sh` block of README.md or docs/*.md is run by a
test (it appears, as the same words, in a string of a test under tests/, or in .ci/run)."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("bench", "common", "configs", "deploy", "docs", "engine", "kernels", "models", "proto", "scripts",
               "server", "tests", "tuner")
TEXT_SUFFIXES = {".md", ".py", ".sh", ".cpp", ".h", ".cu", ".cuh", ".yaml", ".txt", ".cmake", ""}
# The one documented command no test runs: it serves in the foreground until stopped. Its steps are
# scripts/setup and scripts/fetch-models (scripts/test runs both) and `build/server/tessera serve
# --config configs/server.yaml` (tests/integration/test_documented_commands.py).
NOT_RUN_BY_A_TEST = {("scripts/run",)}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RESULTS_PATH = re.compile(r"bench/(?:results|experiments)/[\w.*\-/]*")
RELATIVE_PATH = re.compile(r"(?<![\w/.])\.\./[\w.\-/]+")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def markdown_files() -> list[Path]:
    files = [REPO / "README.md"]
    for folder in ("docs", "bench", "deploy", "tests"):
        files += sorted((REPO / folder).rglob("*.md"))
    return files


def text_files() -> list[Path]:
    files = [REPO / "README.md"]
    for folder in SOURCE_DIRS:
        files += [p for p in sorted((REPO / folder).rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES
                  and "bench/results" not in p.relative_to(REPO).as_posix()]
    return files


def heading_anchors(markdown: Path) -> set[str]:
    """GitHub's anchors: each heading lowercased, punctuation but - and _ dropped, spaces as -."""
    anchors = set()
    for line in markdown.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize("markdown", markdown_files(), ids=rel)
def test_links_resolve(markdown):
    broken = []
    for target in LINK.findall(markdown.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path_part, _, anchor = target.partition("#")
        path = (markdown.parent / path_part).resolve() if path_part else markdown
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, broken


def test_named_result_paths_exist():
    missing = []
    for path in text_files():
        for name in RESULTS_PATH.findall(path.read_text(errors="replace")):
            name = name.rstrip(".-/")
            if not list(REPO.glob(name)):
                missing.append(f"{rel(path)}: {name}")
    assert not missing, missing


def test_result_summaries_name_existing_runs():
    """A run's summary names other runs as ../NAME: each must still be there."""
    missing = []
    for summary in (REPO / "bench" / "results").rglob("*.md"):
        for name in RELATIVE_PATH.findall(summary.read_text()):
            if not (summary.parent / name.rstrip(".")).exists():
                missing.append(f"{rel(summary)}: {name}")
    assert not missing, missing


def documented_commands() -> list[tuple[str, tuple[str, ...]]]:
    """(where, words) for every line of every fenced sh block, continuation lines joined, comments
    dropped."""
    commands = []
    for markdown in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for language, block in FENCE.findall(markdown.read_text()):
            if language not in ("sh", "bash", "shell"):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                words = tuple(shlex.split(line, comments=True))
                if words:
                    commands.append((rel(markdown), words))
    return commands


def commands_run_by_tests() -> set[tuple[str, ...]]:
    """The words of every string in the tests' Python and of every line of .ci/run."""
    run = set()
    strings = []
    for source in (REPO / "tests").rglob("*.py"):
        tree = ast.parse(source.read_text())
        strings += [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                    and isinstance(node.value, str)]
    strings += (REPO / ".ci" / "run").read_text().splitlines()
    for text in strings:
        try:
            run.add(tuple(shlex.split(text, comments=True)))
        except ValueError:
            pass  # not a command: an unbalanced quote
    return run


def test_every_documented_command_is_run_by_a_test():
    run = commands_run_by_tests() | NOT_RUN_BY_A_TEST
    commands = documented_commands()
    assert len(commands) >= 10, commands  # the extraction finds the README's and docs' blocks
    not_run = [f"{where}: {shlex.join(words)}" for where, words in commands if words not in run]
    assert not not_run, "documented commands that no test runs:\n" + "\n".join(not_run)
