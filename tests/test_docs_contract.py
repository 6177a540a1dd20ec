"""The contract a team reads is the contract the code has (as Hypothesis asserts its public
surface): every target key, policy key and driver method is in docs/TARGETS.md and nothing
there is not in the code; targets/example.yaml shows every key."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import yaml

from harness.contract.driver import Driver
from harness.model.system import SystemPolicy
from harness.stack.target import Target, parse

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "TARGETS.md").read_text()


def _documented(section: str) -> set[str]:
    """The ``### name`` headings of one ``## section`` of docs/TARGETS.md."""
    body = DOC.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^### (\S+)$", body, flags=re.M))


def test_every_target_key_is_documented_and_nothing_else():
    assert _documented("Target keys") == {f.name for f in fields(Target)}


def test_every_policy_key_is_documented_and_nothing_else():
    assert _documented("Policy keys") == {f.name for f in fields(SystemPolicy)}


def test_every_driver_method_is_documented_and_nothing_else():
    methods = {m for m in vars(Driver) if not m.startswith("_") and callable(vars(Driver)[m])}
    assert _documented("Driver methods") == methods


def test_the_example_target_file_shows_every_key_and_parses():
    text = (ROOT / "targets" / "example.yaml").read_text()
    shown = set(re.findall(r"^#? ?(?:or )?([a-z_]+):", text, flags=re.M))
    missing = {f.name for f in fields(Target)} - shown
    assert not missing, f"targets/example.yaml does not show {sorted(missing)}"
    parse(yaml.safe_load(text), "example.yaml")
    # Uncommented, every commented key still parses (the example is a file one can copy).
    uncommented = yaml.safe_load(re.sub(r"^# ?(?=[a-z_]+:)", "", text, flags=re.M))
    # Its hooks name the reader's own functions: stand in importable ones.
    uncommented["hooks"] = {k: "harness.contract.driver:named" for k in uncommented["hooks"]}
    parse(uncommented, "example.yaml, every key")


def test_the_target_files_in_the_docs_parse():
    for doc in ("EXTENDING.md", "TARGETS.md"):
        text = (ROOT / "docs" / doc).read_text()
        for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
            data = yaml.safe_load(block)
            if "name" in data:  # a whole target file, not a fragment of one
                # The docs' driver is the reader's own module: stand in an importable one.
                data["driver"] = data.get("driver") and "harness.contract.driver:FanoutApiDriver"
                parse(data, doc)
