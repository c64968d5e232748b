"""The benchmark scripts still run, and say what they measured.

Under test: ``benchmarks/run_all.py`` in ``--smoke`` mode (every script of
``benchmarks/`` in its tiny mode, results written to a temporary file) and
``benchmarks/render_readme.py``.  The oracle is the structure of the
results, never a time: absolute times on a shared machine prove nothing.
The counts that do not depend on the machine (ledger commits per call,
distinct states, crash-campaign counts) are checked exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_group, bench_peers, render_readme, run_all

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "results.json"
    status = run_all.main(["--smoke", "--out", str(out), "--no-readme"])
    assert status == 0, "a benchmark script failed in smoke mode (see the captured output)"
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_every_benchmark_ran_and_the_machine_is_recorded(smoke: dict[str, Any]) -> None:
    assert set(smoke["benchmarks"]) == set(run_all.BENCHMARKS)
    assert not [n for n, b in smoke["benchmarks"].items() if "error" in b]
    machine = smoke["machine"]
    for key in ("date", "nproc", "python", "java", "sqlite", "scratch_fs", "git_commit"):
        assert machine[key], key
    goals = smoke["goals"]
    assert len(goals) == 24  # with call4agents', PostgreSQL's, deep's, async's and quick's
    assert all(set(g) == {"goal", "target", "measured", "met"} for g in goals)
    assert all(g["measured"] is not None for g in goals)


def test_models_figures(smoke: dict[str, Any]) -> None:
    m = smoke["benchmarks"]["models"]
    by_name = {x["name"]: x for x in m["models"]}
    assert by_name["LegacyResume"]["distinct_states"] == 27
    assert by_name["LegacyResume"]["got"] == "AtMostOnceEffect"
    assert all(x["as_expected"] for x in m["models"])
    assert m["ci_set"]["sequential_sum_seconds"] > 0 and m["ci_set"]["parallel_seconds"] > 0
    [cell] = m["growth"]
    assert (cell["calls"], cell["crashes"], cell["complete"]) == (1, 0, True)
    assert cell["distinct_states"] > 0


def test_conformance_figures(smoke: dict[str, Any]) -> None:
    c = smoke["benchmarks"]["conformance"]
    assert c["mismatches"] == 0 and c["states"] > 0 and c["edges"] >= c["states"]
    for key in ("tlc_seconds", "tlc_with_dump_seconds", "load_seconds", "check_seconds",
                "ratio_vs_tlc", "ratio_vs_tlc_with_dump"):
        assert c[key] >= 0, key


def test_sqlite_commit_counts_are_exact(smoke: dict[str, Any]) -> None:
    s = smoke["benchmarks"]["sqlite"]
    assert s["ledger_commits_per_protected_call"] == 2
    assert s["ledger_commits_per_readonly_call"] == 0
    # a new session's 5-call message (lazy_create + execute_message): n + 1 commits in all
    m = s["message_commits"]
    assert m["commits_per_call"] == m["traced_commit_statements_per_call"] == 6 / 5
    assert s["commits_goal_met"]
    assert s["counters_agree_with_sql_trace"] is True
    for kind, c in s["commits"].items():
        assert c["commits_per_call"] == c["traced_commit_statements_per_call"], kind
        if c["strace_syncs"] is not None and "per_call" in c["strace_syncs"]:
            # one sync per commit (WAL, synchronous=FULL), nothing else
            assert c["strace_syncs"]["total_per_call"] == c["commits_per_call"], kind
    assert set(s["ratios"]) >= {"vs_fsync", "vs_fdatasync", "vs_sqlite_commit"}
    assert all(v > 0 for v in s["rates_per_second"].values())


def test_recovery_figures(smoke: dict[str, Any]) -> None:
    r = smoke["benchmarks"]["recovery"]
    assert [int(h) for h in r["by_history"]] == r["history_sizes"]
    for row in r["by_history"].values():
        assert row["total_seconds"] >= row["recover_seconds"] > 0


def test_bugfinding_figures(smoke: dict[str, Any]) -> None:
    h = smoke["benchmarks"]["bugfinding"]
    assert h["hypothesis"]["found_with_seeds"] == h["hypothesis"]["seeds"]
    assert h["control_ledger_engine"]["duplicates_found"] is False
    assert h["tlc"]["violated"] == "AtMostOnceEffect"
    assert h["tlc"]["counterexample_states"] > 1


def test_crash_campaign_smoke_counts(smoke: dict[str, Any]) -> None:
    k = smoke["benchmarks"]["crash_campaign"]
    assert k["kills"] == 5
    assert k["totals"] == dict.fromkeys(k["totals"], 0)
    assert k["corruption"]["silent"] == 0 and k["corruption"]["wrote_anyway"] == 0


def test_power_loss_smoke_counts(smoke: dict[str, Any]) -> None:
    p = smoke["benchmarks"]["power_loss"]
    assert p["real_incorrect"] == 0 and p["goal_met"]
    assert p["states_explored"] >= 100  # two workloads, 60 (+1) states each
    assert all(sum(r["outcomes"].values()) == r["states"] for r in p["rows"])


def test_peers_figures_and_crash_table(smoke: dict[str, Any]) -> None:
    p = smoke["benchmarks"]["peers"]
    assert p["not_installed"] == []  # the dev extra installs every peer
    assert set(p["systems"]) == set(bench_peers.SYSTEMS)
    assert len(p["load_average_1min"]) == p["rounds"] + 1  # sampled at every round's ends
    for name, row in p["systems"].items():
        assert row["calls_per_second"] > 0 and row["cpu_ms_per_call"] > 0, name
        assert row["write_bytes_per_call"] > 0 or row["wchar_per_call"] > 0, name
        if p["syncs_counted_by"] is not None:
            # toolledger syncs at least once per commit (WAL, synchronous=FULL): 2 per
            # message for the together row; each peer at least once per recorded call
            floor = row.get("commits_per_message", bench_peers.CALLS_PER_TURN)
            assert row["syncs_per_call"] * bench_peers.CALLS_PER_TURN >= floor, name
            assert row["slow_calls_per_second"] > 0 and row["nosync_calls_per_second"] > 0
    assert p["systems"][bench_peers.REFERENCE]["ratio_measured_fast"] == 1
    assert p["systems"][bench_peers.SEQUENTIAL_REFERENCE]["sequential_ratio_measured_fast"] == 1
    # commits per 5-call message, by the store's counter: 2n + 2, n + 1, 2
    commits = {s: p["systems"][s]["commits_per_message"] for s in bench_peers.TOOLLEDGER_MODES}
    assert commits == {"toolledger": 12, "toolledger-batched": 6, "toolledger-together": 2}
    for peer, forms in bench_peers.PEER_FORMS.items():
        gl = p["goals"][peer]
        assert gl["row"] == bench_peers.REFERENCE and gl["forms"] == list(forms)
        assert set(gl["best_form"].values()) <= set(forms)
    crash = {(c["system"], c["policy"]): c for c in p["crash"]}
    assert set(crash) == set(bench_peers.CRASH_CASES)
    # the harness really killed every child between its effect and the checkpoint
    assert all(c["killed_after_effect"] for c in crash.values())
    for policy in ("idempotent", "manual", "reconcile"):
        for row in ("toolledger", "toolledger-together"):
            assert crash[(row, policy)]["effects"] == 1
            assert crash[(row, policy)]["duplicates"] == 0
    # the peers re-run a step whose checkpoint was lost: the table's point of comparison
    for peer in ("langgraph", "langgraph-parallel", "dbos", "dbos-wal", "dbos-wal-parallel"):
        assert crash[(peer, "as shipped")]["effects"] >= 1
    # call4agents resends an action in doubt under the same key: deduplicated, one effect
    assert crash[("call4agents", "idempotent_for")]["effects"] == 1


def test_peers_latency_rows(smoke: dict[str, Any]) -> None:
    lat = smoke["benchmarks"]["peers"]["latency"]
    assert [ms for ms, _, _ in lat["plan"]] == list(bench_peers.LATENCIES_MS[:2])
    for ms, rows in lat["systems"].items():
        assert set(rows) == set(bench_peers.LATENCY_SYSTEMS), ms
        assert all(r["calls_per_second"] > 0 for r in rows.values()), ms
        # the concurrent message paths cost the sequential ones' commits: n + 1 and 2
        commits = {s: r["commits_per_message"] for s, r in rows.items()
                   if s in bench_peers.ALL_MODES}
        n = bench_peers.CALLS_PER_TURN
        assert commits == {"toolledger-batched": n + 1, "toolledger-together": 2,
                           "toolledger-concurrent": n + 1,
                           "toolledger-together-concurrent": 2}, ms
        assert set(lat["goals"]["ratios"][ms]) == set(commits)
    assert lat["goals"]["met"] in (True, False)  # judged: a latency > 0 ran
    assert any(g["goal"].startswith("message paths with 20 ms") for g in smoke["goals"])


def test_peers_postgres_rows(smoke: dict[str, Any]) -> None:
    pq = smoke["benchmarks"]["peers"]["postgres"]
    assert pq["not_installed"] == []  # the dev extra installs every peer's PostgreSQL driver
    assert set(pq["systems"]) == set(bench_peers.PG_SYSTEMS)
    for name, row in pq["systems"].items():
        assert row["calls_per_second"] > 0 and row["cpu_ms_per_call"] > 0, name
        # the server flushed its WAL at least once per toolledger commit (fsync on,
        # synchronous_commit on), and every peer wrote WAL for its calls
        floor = row.get("commits_per_message", 1) / bench_peers.CALLS_PER_TURN
        assert row["wal_flushes_per_call"] >= floor, name
        assert row["wal_bytes_per_call"] > 0, name
    # the same commits per message as on SQLite: 2n + 2, n + 1, 2
    commits = {s: r["commits_per_message"] for s, r in pq["systems"].items()
               if "commits_per_message" in r}
    assert commits == {"toolledger-pg": 12, "toolledger-batched-pg": 6,
                       "toolledger-together-pg": 2}
    gl = pq["goals"]
    assert set(gl["ratios"]) == set(bench_peers.PG_JUDGED)
    assert set(gl["best_form"]) == set(bench_peers.PG_PEER_FORMS)
    assert gl["met"] in (True, False)
    assert any(g["goal"].startswith("PostgreSQL, one server") for g in smoke["goals"])


def test_pg_goal_is_judged_against_each_peers_best_form() -> None:
    def row(rate: float) -> dict[str, Any]:
        return {"calls_per_second": rate}

    per = {s: row(100) for s in bench_peers.PG_SYSTEMS}
    per["dbos-parallel-pg"] = row(50)  # dbos-pg (100) is its best form
    per["langgraph-parallel-pg"] = row(80)
    for s in bench_peers.PG_JUDGED:
        per[s] = row(130)
    per["call4agents-pg"] = row(120)  # reported beside the judged peers, not judged
    got = bench_peers.pg_goals(per)
    assert got["best_form"] == {"langgraph-pg": "langgraph-pg", "dbos-pg": "dbos-pg",
                                "call4agents-pg": "call4agents-pg"}
    assert got["ratios"]["toolledger-pg"] == {"langgraph-pg": 1.3, "dbos-pg": 1.3,
                                              "call4agents-pg": 130 / 120}
    assert got["met"] is True
    per["toolledger-pg"] = row(110)  # one path under 1.2x one peer: not met
    assert bench_peers.pg_goals(per)["met"] is False
    assert bench_peers.pg_goals({"toolledger-pg": row(1)})["met"] is None  # no peer ran


def test_pg_rows_name_their_sqlite_workload() -> None:
    assert bench_peers.base_system("dbos-pg") == ("dbos-wal", True)
    assert bench_peers.base_system("toolledger-together-pg") == ("toolledger-together", True)
    assert bench_peers.base_system("langgraph") == ("langgraph", False)
    with pytest.raises(ValueError, match="PostgreSQL"):
        bench_peers.make("langgraph-pg", ROOT, bench_peers.Effects())


def test_latency_goal_judges_the_concurrent_rows_at_every_latency() -> None:
    def rows(tl: float, peer: float) -> dict[str, Any]:
        out = {s: {"calls_per_second": tl} for s in bench_peers.LATENCY_SYSTEMS}
        out.update({p: {"calls_per_second": peer} for p in bench_peers.LATENCY_PEERS})
        return out

    # a slow sequential row never fails the goal; a slow concurrent row at any
    # latency > 0 does; at 0 ms nothing is judged
    ok = {"0": rows(1, 100), "20": rows(200, 100), "200": rows(30, 25)}
    ok["20"]["toolledger-batched"] = {"calls_per_second": 1.0}
    assert bench_peers.latency_goals(ok)["met"] is True
    slow = {**ok, "200": rows(30, 25)}
    slow["200"]["toolledger-concurrent"] = {"calls_per_second": 24.0}
    assert bench_peers.latency_goals(slow)["met"] is False
    assert bench_peers.latency_goals({"0": rows(1, 2)})["met"] is None


def test_together_row_takes_two_commits_per_message(tmp_path: Path) -> None:
    # the worker reads the store's counters over its timed turns only
    for d in ("t", "b", "l"):
        (tmp_path / d).mkdir()
    together = bench_peers.worker("toolledger-together", tmp_path / "t", 1, 3)
    assert (together["commits"], together["ledger_commits"]) == (2 * 3, 2 * 3)
    batched = bench_peers.worker("toolledger-batched", tmp_path / "b", 1, 3)
    assert batched["commits"] == (bench_peers.CALLS_PER_TURN + 1) * 3
    assert "commits" not in bench_peers.worker("langgraph-parallel", tmp_path / "l", 1, 1)


@pytest.mark.parametrize("policy", ["idempotent", "manual", "reconcile"])
def test_together_crash_row_applies_the_effect_once(tmp_path: Path, policy: str) -> None:
    row = bench_peers.crash_row("toolledger-together", tmp_path, policy)
    assert row["killed_after_effect"] is True
    assert (row["effects"], row["duplicates"]) == (1, 0)


@pytest.mark.parametrize("policy, next_step", [("idempotent", "retry"), ("manual", "halted"),
                                               ("reconcile", "reconcile")])
def test_together_crash_leaves_every_call_of_the_message_unknown(
        tmp_path: Path, policy: str, next_step: str) -> None:
    # the price of together=True: killed after the FIRST call's effect, every call of the
    # 5-call message was dispatched in the first commit and is decided by its policy
    from toolledger import Session, SqliteStore, Tool

    code = (f"b.toolledger_turns(b.Path({str(tmp_path)!r}), b.Effects(b.Path("
            f"{str(tmp_path / 'effects.log')!r})), {policy!r}, lambda: b.os.kill(b.os.getpid(), "
            "b.signal.SIGKILL), mode='together')[0](0)")
    first = subprocess.run(bench_peers._child_code(code), capture_output=True, text=True,
                           timeout=120, check=False)
    assert first.returncode == -9, first.stderr[-2000:]
    assert (tmp_path / "effects.log").read_text().count("\n") == 1
    with SqliteStore(tmp_path / "toolledger.sqlite3") as store:
        s = Session.open(store, "turn-0", {"send": Tool(policy, requires_approval=False)})
        statuses = s.recover()
    assert [st.next.value for st in statuses] == [next_step] * bench_peers.CALLS_PER_TURN


def _row(rate: float, syncs: float) -> dict[str, Any]:
    return {"calls_per_second": rate, "slow_calls_per_second": rate / 4,
            "model_fast_disk_calls_per_second": rate, "model_slow_disk_calls_per_second": rate / 4,
            "syncs_per_call": syncs, "write_bytes_per_call": 10_000.0}


def test_peer_goals_judge_the_reference_against_each_peers_best_form() -> None:
    per = {"toolledger-together": _row(1000, 0.4), "toolledger-batched": _row(500, 1.2),
           "langgraph": _row(300, 1.6), "langgraph-parallel": _row(400, 1.6),
           "dbos-wal": _row(450, 1.4), "dbos-wal-parallel": _row(200, 1.5)}
    goals = bench_peers.peer_goals(per)
    lg, db = goals["langgraph"], goals["dbos-wal"]
    assert set(lg["best_form"].values()) == {"langgraph-parallel"}
    assert set(db["best_form"].values()) == {"dbos-wal"}
    assert lg["ratio_measured_fast"] == 1000 / 400 and lg["sequential_ratio_measured_fast"] == 1.25
    assert db["ratio_measured_fast"] == 1000 / 450 and db["met"] is True
    assert db["sequential_met"] is False and db["met_by"] == ["toolledger-together"]
    assert lg["met_by"] == ["toolledger-together", "toolledger-batched"]
    # the sync bound takes the peer's form with the fewest syncs per call
    assert db["ratio_sync_bound"] == 1.4 / 0.4
    assert goals["syncs_per_call"]["measured"] == 0.4
    assert goals["syncs_per_call"]["sequential_measured"] == 1.2
    assert goals["syncs_per_call"]["met_by"] == ["toolledger-together", "toolledger-batched"]
    # the plain row (record, then execute per call) is judged on its own, never quoted
    # the together row's ratio (issue 27); without it, its keys say so (None)
    assert lg["plain_ratio_measured_fast"] is None and lg["plain_met"] is False
    per["toolledger"] = _row(480, 2.4)
    goals = bench_peers.peer_goals(per)
    lg, db = goals["langgraph"], goals["dbos-wal"]
    assert lg["plain_row"] == "toolledger" and lg["plain_ratio_measured_fast"] == 480 / 400
    assert lg["plain_met"] is True and db["plain_met"] is False
    assert lg["met_by"] == ["toolledger-together", "toolledger-batched", "toolledger"]
    assert db["plain_ratio_sync_bound"] == 1.4 / 2.4
    assert goals["syncs_per_call"]["plain_measured"] == 2.4


def test_marked_syncs_are_counted_only_between_the_marks() -> None:
    log = "\n".join([
        '10 fdatasync(3) = 0',
        f'10 access("{bench_peers.MARK_BEGIN}", F_OK) = -1 ENOENT',
        '10 fdatasync(3) = 0', '11 fsync(4) = 0', '10 fdatasync(3) = 0',
        f'10 access("{bench_peers.MARK_END}", F_OK) = -1 ENOENT',
        '10 fsync(3) = 0',
    ])
    assert bench_peers.count_marked_syncs(log) == {"fdatasync": 2, "fsync": 1}


def test_render_readme_rewrites_only_the_block(smoke: dict[str, Any], tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(smoke))
    readme = tmp_path / "README.md"
    before = "# title\n\ntext\n\n<!-- bench:begin -->\nold figures\n<!-- bench:end -->\n\ntail\n"
    readme.write_text(before)
    assert render_readme.main(["--results", str(results), "--readme", str(readme)]) == 0
    after = readme.read_text()
    head, _, rest = after.partition("<!-- bench:begin -->\n")
    block, _, tail = rest.partition("<!-- bench:end -->\n")
    assert head == "# title\n\ntext\n\n" and tail == "\ntail\n"
    assert "old figures" not in block and "| goal | target | measured | met |" in block
    assert render_readme.main(["--results", str(results), "--readme", str(readme),
                               "--check"]) == 0


def test_render_readme_without_markers_writes_nothing(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "render_readme.py"), "--readme", str(readme),
         "--results", str(tmp_path / "missing.json")],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert done.returncode == 2
    assert "<!-- bench:begin -->" in done.stderr and "Nothing was written" in done.stderr
    assert readme.read_text() == "# no markers here\n"


def test_a_script_runs_stand_alone() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_recovery.py"), "--smoke", "--json"],
        capture_output=True, text=True, check=False, timeout=300, cwd=ROOT / "tests",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout[done.stdout.index("\n{") + 1:])
    assert data["history_sizes"] == [50, 500]


def test_bytes_breakdown(smoke: dict[str, Any]) -> None:
    m = smoke["benchmarks"]["bytes"]["measured"]
    # 5-call turns as an engine runs them (lazy_create + execute_message): n + 1 commits,
    # the session's creation and the message's record inside the first
    assert m["commits_per_call"] == 6 / 5
    assert m["wal_commit_frames_per_call"] == m["commits_per_call"]
    assert m["wal_frames_per_call"] >= m["commits_per_call"]
    # the floor: one page per table or index a commit touches, at most every frame
    assert m["commits_per_call"] <= m["floor_frames_per_call"] <= m["wal_frames_per_call"]
    frames = m["wal_frames_per_call_by_object"]
    # schema 7: a call's record is in its row (no ledger table, nor its id index)
    assert {"calls", "audit"} <= set(frames) and not any("ledger" in t for t in frames)
    assert abs(sum(frames.values()) - m["wal_frames_per_call"]) < 1e-9
    assert m["rows_per_call"]["calls"] == 1 and m["rows_per_call"]["audit"] >= 1
    p = smoke["benchmarks"]["bytes"]["profile"]
    assert p["cpu_ms_per_call_nosync"] > 0 and p["top"]


def test_group_commit_figures(smoke: dict[str, Any]) -> None:
    g = smoke["benchmarks"]["group"]
    rows = {(r["disk"], r["sessions"], r["group_commit"]): r for r in g["rows"]}
    for n in bench_group.SESSIONS:  # bench_peers' toolledger-batched turn: n + 1 commits
        assert rows[("this disk", n, True)]["commits_per_call"] == 6 / 5
    # the bound per disk: one session with syncs skipped over one session on that disk
    ceiling = rows[("no sync", 1, True)]["calls_per_second"]
    assert set(g["cpu_ceiling_over_one_session"]) == set(g["speedup"])
    for disk, bound in g["cpu_ceiling_over_one_session"].items():
        assert bound == ceiling / rows[(disk, 1, True)]["calls_per_second"]
    many = rows[("this disk", max(bench_group.SESSIONS), True)]
    alone = rows[("this disk", max(bench_group.SESSIONS), False)]
    # grouping shares syncs; without it every commit is its own
    assert many["store_syncs_per_call"] < many["commits_per_call"]
    assert alone["store_syncs_per_call"] == alone["commits_per_call"]
