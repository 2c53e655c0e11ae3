"""``python -m recipe.tools.study.graders FILE``: our MATH grader (``math_score``) against
``math-verify`` (Hugging Face's grader: LaTeX parsed into sympy), response by response.

    responses.jsonl (python -m recipe.tools.study.lengths)   every response graded by both
        --> 2x2 table, agreement rate, each disagreement   FILE.graders.json beside it
    --references DATA (rows in verl's schema, e.g. prepared MATH-500 test.parquet)
        every ground truth as a response: boxed, in a sentence, and lightly rewritten
        (\\frac <-> \\dfrac, spaces removed, a space after commas); both graders should
        accept every one --> per rewrite and overall  DATA.graders.json beside it

A study's accuracy is only as good as its grader: where the two disagree, one of them is
wrong, and the list says which answers to look at. math-verify is an optional extra
(``pip install '.[study]'``); without it the command says so in one line (exit code 2).
math-verify also reads an answer that is not boxed (the last number or expression), which
``math_score`` scores 0, as training's reward does; each disagreement says ``has_box``.
The recorded ``reward`` of each response is checked against ``math_score`` too: a mismatch
means the run scored with another function (``reward.custom_fn``, an overlong penalty).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipe.data.loaders import DataError, iter_jsonl_objects, load_records
from recipe.reward.scorers import last_boxed, math_score

# A comma between thousands: "58,500", "10,\!080", "1{,}008".
_THOUSANDS = re.compile(r"\d(?:,|\{,\})(?:\\!)?\s*\d{3}(?!\d)")
Grader = Callable[[str, str], bool]
"""``grade(response, ground_truth) -> correct``."""


def ours(response: str, truth: str) -> bool:
    return math_score("math", response, truth) == 1.0


def math_verify_grader() -> Grader:
    """math-verify's verdict (the gold answer boxed, the response's answer found as
    math-verify finds it); ``ValueError`` when it is not installed."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ValueError(
            "math-verify is not installed: pip install 'math-verify>=0.7' (the study extra)"
        ) from None

    def grade(response: str, truth: str) -> bool:
        gold = parse(f"\\boxed{{{truth}}}")
        return bool(gold) and bool(verify(gold, parse(response)))

    return grade


@dataclass(frozen=True, slots=True)
class Case:
    """One response to grade."""

    key: str
    """What names it in the report (a prompt uid and sample, or a reference and rewrite)."""
    response: str
    truth: str
    info: dict[str, Any] = field(default_factory=dict)
    """Carried into a disagreement's record (level, the recorded reward...)."""


@dataclass
class Comparison:
    """Two graders' verdicts on the same cases: the 2x2 table and the disagreements."""

    table: dict[str, int] = field(
        default_factory=lambda: {"both": 0, "ours_only": 0, "theirs_only": 0, "neither": 0}
    )
    disagreements: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_cases(self) -> int:
        return sum(self.table.values())

    @property
    def agreement(self) -> float:
        agree = self.table["both"] + self.table["neither"]
        return agree / self.num_cases if self.num_cases else float("nan")

    def add(self, case: Case, mine: bool, theirs: bool) -> None:
        cell = {(True, True): "both", (True, False): "ours_only", (False, True): "theirs_only"}
        self.table[cell.get((mine, theirs), "neither")] += 1
        if mine != theirs:
            self.disagreements.append(
                {
                    "key": case.key,
                    "truth": case.truth,
                    "ours": mine,
                    "math_verify": theirs,
                    "has_box": last_boxed(case.response) is not None,
                    "response_tail": case.response[-300:],
                    **case.info,
                }
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "num_cases": self.num_cases,
            "agreement": self.agreement,
            "ours_accepts": (self.table["both"] + self.table["ours_only"]) / max(1, self.num_cases),
            "math_verify_accepts": (self.table["both"] + self.table["theirs_only"])
            / max(1, self.num_cases),
            "table": dict(self.table),
            "disagreements": self.disagreements,
        }


def compare(cases: Iterable[Case], theirs: Grader, mine: Grader = ours) -> Comparison:
    comparison = Comparison()
    for case in cases:
        comparison.add(case, mine(case.response, case.truth), theirs(case.response, case.truth))
    return comparison


def response_cases(path: Path) -> list[Case]:
    """The responses of a ``responses.jsonl``; ``ValueError`` naming a line without the fields."""
    cases = []
    try:
        for line_no, row in iter_jsonl_objects(path):
            if not all(isinstance(row.get(k), str) for k in ("text", "ground_truth")):
                raise ValueError(f"{path}: line {line_no}: needs string 'text' and 'ground_truth'")
            key = f"{row.get('prompt_uid')}#{row.get('sample_index')}"
            info: dict[str, Any] = {
                k: row[k] for k in ("level", "reward", "finish_reason") if k in row
            }
            cases.append(Case(key, row["text"], row["ground_truth"], info))
    except DataError as err:
        raise ValueError(str(err)) from None
    if not cases:
        raise ValueError(f"{path}: no responses")
    return cases


def rewrites(truth: str) -> dict[str, str]:
    """The answer as responses: boxed, in a sentence, and each light rewrite that changes it
    (a space after commas only where no comma separates thousands: "58, 500" is a pair)."""
    boxed = {
        "boxed": truth,
        "dfrac_to_frac": truth.replace("\\dfrac", "\\frac"),
        "frac_to_dfrac": truth.replace("\\frac", "\\dfrac").replace("\\ddfrac", "\\dfrac"),
        "no_spaces": truth.replace(" ", ""),
        "space_after_comma": ", ".join(part.strip() for part in truth.split(",")),
    }
    if _THOUSANDS.search(truth):
        del boxed["space_after_comma"]
    out = {"sentence": f"So the final answer is $\\boxed{{{truth}}}$."}
    out.update({name: f"\\boxed{{{text}}}" for name, text in boxed.items()
                if name == "boxed" or text != truth})  # fmt: skip
    return out


def reference_cases(path: Path) -> list[Case]:
    records = load_records([str(path)], split="test")
    return [
        Case(f"{r.uid}/{name}", response, r.ground_truth, {"rewrite": name})
        for r in records
        for name, response in rewrites(r.ground_truth).items()
    ]


def by_rewrite(cases: list[Case], theirs: Grader) -> dict[str, dict[str, Any]]:
    """Per rewrite: how many, and how often each grader accepts the (correct) answer."""
    names = sorted({c.info["rewrite"] for c in cases})
    out = {}
    for name in names:
        result = compare([c for c in cases if c.info["rewrite"] == name], theirs).to_json()
        out[name] = {k: result[k] for k in ("num_cases", "ours_accepts", "math_verify_accepts")}
    return out


def format_table(comparison: Comparison) -> str:
    t = comparison.table
    return "\n".join(
        [
            f"{'':>10} {'math_verify=1':>14} {'math_verify=0':>14}",
            f"{'ours=1':>10} {t['both']:>14} {t['ours_only']:>14}",
            f"{'ours=0':>10} {t['theirs_only']:>14} {t['neither']:>14}",
            f"agreement {comparison.agreement:.4f} over {comparison.num_cases} cases, "
            f"{len(comparison.disagreements)} disagreements",
        ]
    )


def load_cases(path: Path, *, references: bool) -> list[Case]:
    """The cases of ``path``; ``ValueError`` naming a missing file or a bad row."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    return reference_cases(path) if references else response_cases(path)


def run(path: Path, cases: list[Case], theirs: Grader, *, references: bool) -> dict[str, Any]:
    """Grade, print, and write ``<path>.graders.json``; returns what it wrote."""
    comparison = compare(cases, theirs)
    report: dict[str, Any] = {
        "input": str(path),
        "mode": "references" if references else "responses",
    }
    report.update(comparison.to_json())
    print(format_table(comparison))
    if references:
        report["by_rewrite"] = by_rewrite(cases, theirs)
        for name, row in report["by_rewrite"].items():
            accepts = (
                f"ours {row['ours_accepts']:.3f}, math_verify {row['math_verify_accepts']:.3f}"
            )
            print(f"  {name:<18} {row['num_cases']:>5} cases accepted by {accepts}")
    else:
        recorded = [c for c in cases if isinstance(c.info.get("reward"), int | float)]
        report["reward_differs_from_ours"] = sum(
            float(c.info["reward"]) != float(ours(c.response, c.truth)) for c in recorded
        )
    out = path.with_name(path.name + ".graders.json")
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.tools.study.graders", description=__doc__
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("path", type=Path, help="responses.jsonl, or a data file with --references")
    parser.add_argument(
        "--references", action="store_true", help="grade the file's ground truths themselves"
    )
    args = parser.parse_args(argv)
    try:  # bad input (math-verify missing, a file, a row): one line, exit code 2
        theirs = math_verify_grader()
        cases = load_cases(args.path, references=args.references)
    except ValueError as err:
        if os.environ.get("RECIPE_DEBUG", "0") not in ("", "0"):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    run(args.path, cases, theirs, references=args.references)
    return 0


if __name__ == "__main__":
    sys.exit(main())
