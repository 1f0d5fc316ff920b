"""Run checkov over infra/terraform and fail unless it passes with reasoned skips only.

checkov's own exit status says only whether a check failed; this also requires every skip
(``#checkov:skip=ID:reason`` in the code) to carry its reason, the terraform framework to have
run with no parsing error, and enough checks to have passed that a configuration checkov
silently stopped reading is noticed.

    python .ci/checkov_report.py CHECKOV_EXECUTABLE infra/terraform
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

TIMEOUT_S = 300
MIN_REASON_CHARS = 20
MIN_TERRAFORM_PASSED = 100
"""infra/terraform passed about 170 checks when this was written: far fewer means checkov
skipped files, not that they got better."""


def problems(reports: list[dict[str, Any]]) -> list[str]:
    """What is wrong in checkov's JSON reports (one per framework); empty when all is well."""
    found: list[str] = []
    for report in reports:
        results = report["results"]
        for check in results.get("failed_checks", []):
            found.append(
                f"{report['check_type']}: {check['check_id']} failed on {check['resource']} "
                f"({check['file_path']})"
            )
        skipped = results.get("skipped_checks", [])
        # Without the list (checkov's --quiet leaves it out) the reasons would go unread.
        if len(skipped) != report["summary"]["skipped"]:
            found.append(f"{report['check_type']}: the report does not list its skipped checks")
        for check in skipped:
            reason = (check.get("check_result", {}).get("suppress_comment") or "").strip()
            if len(reason) <= MIN_REASON_CHARS:
                found.append(f"{check['check_id']} is skipped without a reason")
    terraform = [report for report in reports if report["check_type"] == "terraform"]
    if not terraform:
        found.append("checkov ran no terraform checks")
    for report in terraform:
        summary = report["summary"]
        if summary["parsing_errors"]:
            found.append(f"checkov could not parse {summary['parsing_errors']} terraform file(s)")
        if summary["passed"] <= MIN_TERRAFORM_PASSED:
            found.append(f"only {summary['passed']} terraform checks passed")
    return found


def main(argv: list[str]) -> int:
    checkov, directory = argv
    result = subprocess.run(
        # --skip-download: nothing to fetch (CI may have no network; the checks ship with it).
        [checkov, "--directory", directory, "--output", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    try:
        parsed = json.loads(result.stdout)
    except json.JSONDecodeError:
        print(f"checkov gave no JSON report:\n{result.stdout}\n{result.stderr}", file=sys.stderr)
        return 1
    reports: list[dict[str, Any]] = parsed if isinstance(parsed, list) else [parsed]
    found = problems(reports)
    for problem in found:
        print(problem, file=sys.stderr)
    passed = sum(report["summary"]["passed"] for report in reports)
    print(f"checkov: {passed} checks passed, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
