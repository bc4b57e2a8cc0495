"""``paratrain check`` on the corpus in tests/check/corpus: no false alarms, the mistakes found.

125 correct training scripts and 292 with one planted mistake each, written in the shapes of
public training code (pytorch/examples, torchvision references, timm, DeiT, MAE, OpenCLIP, DETR,
HF no-trainer scripts, nanoGPT, minGPT, Megatron, torchtune, torchtitan, fairseq-, mmcv- and
speechbrain-style trainers) in three rounds; docs/rules/index.md has the per-rule table.
``python -m tests.check.corpus.score --misses`` prints it with every miss.

    pytest tests/check/test_corpus.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from paratrain.commands.check.engine import rules_by_id
from tests.check.corpus.score import HERE, Score, score, table


@pytest.fixture(scope="module")
def result() -> Score:
    return score()


def test_no_finding_on_a_correct_script_and_none_beside_a_planted_mistake(result: Score) -> None:
    alarms = [
        f"{Path(f.path).relative_to(HERE)}:{f.line}: {f.rule} {f.message}" for f in result.alarms
    ]
    assert alarms == []
    assert result.clean >= 120


@pytest.mark.parametrize("rule", list(rules_by_id()))
def test_each_rule_finds_at_least_nine_in_ten_of_its_planted_mistakes(
    result: Score, rule: str
) -> None:
    assert result.planted[rule] >= 3, f"{rule}: too few planted scripts to measure"
    misses = [m for m in result.misses if m.endswith(f"{rule} not found")]
    recall = result.recall(rule) or 0.0
    assert recall >= 0.9, "\n".join(misses)


def test_the_table_in_the_docs_is_the_measured_one(result: Score) -> None:
    index = (HERE.parents[2] / "docs" / "rules" / "index.md").read_text(encoding="utf-8")
    assert table(result) in index, "run python -m tests.check.corpus.score and paste the table"
