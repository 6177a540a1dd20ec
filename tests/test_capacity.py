"""The capacity model: the seed's napkin figures, the bench correction and the CLI around them."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from harness.analysis import capacity
from harness.analysis.capacity import CapacityError, CapacityInputs, build_plan, load_bench_rates

ROOT = Path(__file__).resolve().parent.parent
REQUIRED_KEYS = {
    "writes_per_event",
    "write_rate_per_s",
    "ulid_collision_probability",
    "fcm_drain_seconds",
    "dedup_memory_bytes",
    "monthly_cost_usd_low",
    "monthly_cost_usd_high",
}

# The figures seeds/000 prints for its 50M-follower scenario.
SEED = {
    "writes_per_event": 5e7,
    "write_rate_per_s": 8.3e5,
    "ulid_collision_probability": 4e-13,
    "fcm_drain_seconds": 1000.0,
    "dedup_memory_bytes": 240e9,
    "monthly_cost_usd_low": 17_000.0,
    "monthly_cost_usd_high": 22_000.0,
}


def seed_plan(**changes: float) -> capacity.CapacityPlan:
    return build_plan(CapacityInputs(**changes), load_bench_rates(None))


def cli(*argv: str) -> int:
    """The subcommand as harness/cli.py will mount it, without touching harness/cli.py."""
    parser = argparse.ArgumentParser(prog="python -m harness")
    sub = parser.add_subparsers(dest="command", required=True)
    capacity.add_parser(sub)
    args = parser.parse_args(["capacity", *argv])
    return args.func(args)


def write_bench(directory: Path) -> Path:
    """A bench dir shaped like `make bench` output, with round numbers to size by hand."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "foundation.json").write_text(
        json.dumps(
            {
                "benchmark": "foundation",
                "cpu_count": 2,
                "e2e_deliveries_per_s": 600.0,
                "redis_set_nx_ops_per_s_one_client": 10_000.0,
                "redis_set_nx_ops_per_s_pipeline16": 80_000.0,
            }
        )
    )
    set_nx = "SET k 1 NX EX 2592000"
    (directory / "proxy.json").write_text(
        json.dumps(
            {
                "throughput": [
                    {"command": "PING", "clients": 50, "pipeline": 1, "direct_ops_s": 99_999},
                    {"command": set_nx, "clients": 4, "pipeline": 1, "direct_ops_s": 30_000},
                    {"command": set_nx, "clients": 50, "pipeline": 1, "direct_ops_s": 40_000},
                    {"command": set_nx, "clients": 50, "pipeline": 16, "direct_ops_s": 200_000},
                ]
            }
        )
    )
    (directory / "sqs.json").write_text(
        json.dumps(
            {
                "batch_size": 10,
                "ours": {
                    "p50_ms": {"depth_0": {"SendMessageBatch": 1.0}},
                    "throughput": {"sent_per_s": 5_000.0},
                },
            }
        )
    )
    return directory


# -- the seed's figures ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(SEED))
def test_each_seed_figure_is_reproduced_within_5_percent_at_50m(key):
    value = getattr(seed_plan(), key)
    assert value == pytest.approx(SEED[key], rel=0.05)


def test_the_defaults_are_the_seeds_scenario():
    plan = seed_plan()
    assert plan.inputs.followers == 50_000_000
    assert plan.push_messages == pytest.approx(1e7)  # 20% of 50M, the seed's D
    assert plan.write_capacity_units_per_s == pytest.approx(833_333, rel=0.01)  # "~833k WCU"
    assert plan.writes_per_event_two_tier == 1


def test_100m_followers_doubles_the_linear_figures():
    fifty, hundred = seed_plan(), seed_plan(followers=100_000_000)
    for key in ("writes_per_event", "write_rate_per_s", "push_messages", "fcm_drain_seconds"):
        assert getattr(hundred, key) == pytest.approx(2 * getattr(fifty, key)), key
    assert hundred.fcm_projects == 34 and fifty.fcm_projects == 17
    assert hundred.push_consumers in (2 * fifty.push_consumers - 1, 2 * fifty.push_consumers)
    # Neither depends on the follower count: a bigger celebrity costs no more a month.
    assert hundred.dedup_memory_bytes == fifty.dedup_memory_bytes
    assert hundred.monthly_cost_usd_high == fifty.monthly_cost_usd_high


def test_ulid_odds_are_the_birthday_bound_over_80_bits():
    assert capacity.ulid_collision_probability(2**40) == pytest.approx(0.5)
    assert capacity.ulid_collision_probability(2**60) == 1.0
    assert capacity.ulid_collision_probability(0) == 0.0


def test_planned_fcm_projects_are_the_fewest_that_meet_the_sla():
    plan = seed_plan()
    assert plan.fcm_drain_seconds_planned <= 60
    assert capacity.fcm_drain_seconds(plan.push_messages, plan.fcm_projects - 1) > 60


def test_one_region_has_no_global_tables_line_and_the_total_is_the_sum():
    lines = capacity.cost_lines(2e9, regions=1, dedup_bytes=240e9)
    dynamodb = lines[0]
    assert (dynamodb.low_usd, dynamodb.high_usd) == (5_000.0, 5_000.0)  # 2e9 x 2 x $1.25/M
    low, high = capacity.monthly_cost(lines)
    assert low == sum(line.low_usd for line in lines)
    assert high == sum(line.high_usd for line in lines)
    assert all(line.source == "seed" for line in lines)


# -- the bench correction -------------------------------------------------------------------------


def test_bench_rates_size_the_fleet_and_name_their_file_and_key(tmp_path):
    bench = write_bench(tmp_path / "bench")
    plan = build_plan(CapacityInputs(), load_bench_rates(bench), bench)
    # 1e7 pushes in 60 s at 600/2 = 300 deliveries/s per core.
    assert plan.push_consumers == math.ceil(1e7 / 60 / 300) == 556
    assert plan.dedup_shards == 5  # 166,667/s over 40,000 (the 50-client row, not the 4-client)
    assert plan.dedup_shards_pipelined == 1
    assert plan.fanout_page_out_seconds == pytest.approx(2_000)
    assert plan.fanout_workers == 34
    assert plan.kinesis_shards == 2  # 2e9/month x 10 at peak = 7,716 jobs/s over 5,000/s
    assert plan.sources["push_consumers"] == (
        f"{bench / 'foundation.json'}: e2e_deliveries_per_s / cpu_count (2)"
    )
    assert "proxy.json" in plan.sources["dedup_shards"]
    assert "clients=50, pipeline=1].direct_ops_s" in plan.sources["dedup_shards"]
    assert plan.sources["fanout_workers"].endswith("sqs.json: ours.throughput.sent_per_s")
    assert not any("fallback" in note for note in plan.notes)


def test_sqs_latency_stands_in_when_the_throughput_key_is_absent(tmp_path):
    (tmp_path / "sqs.json").write_text(
        json.dumps(
            {"ours": {"p50_ms": {"depth_0": {"SendMessageBatch": 9.0},
                                 "depth_100000": {"SendMessageBatch": 2.0}}}}
        )
    )  # fmt: skip
    rate = load_bench_rates(tmp_path).sqs_enqueue_per_s_per_core
    assert rate.value == pytest.approx(10 * 1000 / 2.0)  # the deepest queue, batches of 10
    assert rate.source.endswith("batch_size / ours.p50_ms.depth_100000.SendMessageBatch")


def test_without_bench_files_every_rate_falls_back_and_says_so(tmp_path, capsys):
    assert cli("--bench", str(tmp_path)) == 0
    out = capsys.readouterr().out
    rates = load_bench_rates(tmp_path)
    consumer = rates.push_deliveries_per_s_per_core
    assert consumer.value == 2_000.0
    assert consumer.source.startswith("seed: ")
    assert f"{tmp_path / 'foundation.json'} absent" in consumer.source
    assert rates.dedup_set_nx_per_s_per_shard.source.startswith("DESIGN.md §6")
    assert rates.sqs_enqueue_per_s_per_core.value is None
    plan = build_plan(CapacityInputs(), rates, tmp_path)
    assert plan.push_consumers == math.ceil(1e7 / 60 / 2_000)
    assert plan.fanout_page_out_seconds is None and plan.fanout_workers is None
    assert consumer.source in out and "not sized" in out


@pytest.mark.parametrize("e2e", [None, 0.0, "fast"])
def test_a_missing_or_unusable_key_falls_back_naming_the_key(tmp_path, e2e):
    body = {"cpu_count": 2} if e2e is None else {"cpu_count": 2, "e2e_deliveries_per_s": e2e}
    (tmp_path / "foundation.json").write_text(json.dumps(body))
    rate = load_bench_rates(tmp_path).push_deliveries_per_s_per_core
    assert rate.value == 2_000.0
    assert rate.source.startswith("seed: ")
    assert "foundation.json has no positive e2e_deliveries_per_s" in rate.source


def test_the_default_bench_dir_may_be_absent(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no reports/bench here: a checkout before its first make bench
    assert cli("--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["bench_dir"] is None
    assert "reports/bench absent, run `make bench`" in plan["sources"]["push_consumers"]


def test_a_corrupt_bench_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "proxy.json").write_text("{not json")
    assert cli("--bench", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "proxy.json is not readable JSON" in err


# -- the CLI --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--followers", "-5"], "--followers"),
        (["--followers", "1.5"], "--followers"),
        (["--push-fraction", "1.5"], "--push-fraction"),
        (["--push-fraction", "-0.1"], "--push-fraction"),
        (["--push-fraction", "nan"], "--push-fraction"),
        (["--fcm-projects", "0"], "--fcm-projects"),
        (["--sla-seconds", "0"], "--sla-seconds"),
        (["--regions", "0"], "--regions"),
        (["--sends-per-month", "-1"], "--sends-per-month"),
        (["--bench", "/no/such/bench/dir"], "--bench"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, flag, capsys):
    assert cli(*argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {flag} ")
    assert captured.out == ""


def test_inputs_refuse_bad_values_outside_the_cli_too():
    with pytest.raises(CapacityError, match="--fcm-projects must be a whole number >= 1"):
        CapacityInputs(fcm_projects=0)


def test_json_output_parses_and_has_the_required_keys(tmp_path, capsys):
    assert cli("--bench", str(tmp_path), "--followers", "50_000_000", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert REQUIRED_KEYS <= plan.keys()
    assert {"kinesis_shards", "push_consumers", "fcm_projects", "cost_lines", "sources"} <= set(
        plan
    )
    assert plan["writes_per_event"] == 50_000_000
    assert plan["inputs"]["push_fraction"] == 0.2
    assert set(plan["sources"]) >= REQUIRED_KEYS


def test_out_writes_json_markdown_and_a_png(tmp_path, capsys):
    bench = write_bench(tmp_path / "bench")
    out = tmp_path / "report"
    assert cli("--bench", str(bench), "--out", str(out), "--json") == 0
    captured = capsys.readouterr()
    assert json.loads((out / "capacity.json").read_text()) == json.loads(captured.out)
    assert "wrote" in captured.err  # stdout holds only the JSON
    markdown = (out / "capacity.md").read_text()
    assert "| push consumers (cores) | 556 |" in markdown
    assert "foundation.json: e2e_deliveries_per_s / cpu_count (2)" in markdown
    png = (out / "capacity.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_out_onto_a_file_is_an_error(tmp_path, capsys):
    target = tmp_path / "capacity"
    target.write_text("")
    assert cli("--bench", str(tmp_path), "--out", str(target)) == 2
    assert "is not a directory" in capsys.readouterr().err


def run_main(*argv: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from harness.analysis.capacity import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_standalone_main_in_a_subprocess(tmp_path):
    good = run_main("--followers", "1e8", "--bench", str(tmp_path), "--json")
    assert good.returncode == 0, good.stderr
    plan = json.loads(good.stdout)
    assert REQUIRED_KEYS <= plan.keys()
    assert plan["writes_per_event"] == 100_000_000
    assert plan["fcm_drain_seconds"] == pytest.approx(2_000)
    bad = run_main("--followers", "-1")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: --followers must be a whole number >= 0")
