"""A run's verdicts as JUnit XML, for CI."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from harness.analysis import metrics
from harness.checkers.verdict import SWITCHED_OFF, result_status
from harness.report.document import counts_text


def junit_xml(summary: dict[str, Any], duration_s: float = 0.0) -> str:
    """One testsuite, one testcase per checker; the run's own error is an error testcase."""
    scenario = str(summary.get("scenario", "run"))
    checkers = summary.get("checkers", {}) or {}
    statuses = {name: result_status(r) for name, r in checkers.items()}
    failures = sum(1 for s in statuses.values() if s in ("fail", "unknown"))
    skipped = sum(1 for s in statuses.values() if s == "off")
    error = summary.get("error")
    errors = 1 if error or not checkers else 0
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        {
            "name": f"fanout-harness.{scenario}",
            "tests": str(len(checkers) + errors),
            "failures": str(failures),
            "errors": str(errors),
            "skipped": str(skipped),
            "time": f"{duration_s:.3f}",
        },
    )
    props = ET.SubElement(suite, "properties")
    for key in ("run_id", "scenario", "seed", "verdict"):
        ET.SubElement(props, "property", {"name": key, "value": str(summary.get(key, ""))})
    for name, result in checkers.items():
        case = ET.SubElement(
            suite, "testcase", {"classname": f"harness.{scenario}", "name": name, "time": "0"}
        )
        if statuses[name] == "off":
            ET.SubElement(case, "skipped", {"message": str(result.get(SWITCHED_OFF))})
        elif statuses[name] == "unknown":
            ET.SubElement(
                case,
                "failure",
                {"message": f"{name} could not decide: {result.get('unknown')}", "type": "Unknown"},
            )
        elif statuses[name] == "fail":
            failure = ET.SubElement(
                case,
                "failure",
                {"message": f"{name} violated: {counts_text(result)}", "type": "InvariantViolated"},
            )
            failure.text = "\n".join(
                f"{k} = {v}" for k, v in metrics.checker_counts(result).items()
            )
    if errors:
        case = ET.SubElement(
            suite, "testcase", {"classname": f"harness.{scenario}", "name": "run", "time": "0"}
        )
        message = str(error) if error else "no checker ran"
        ET.SubElement(case, "error", {"message": message, "type": "RunError"}).text = message
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
