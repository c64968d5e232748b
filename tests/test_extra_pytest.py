"""The connector contract kit (toolledger.extra.pytest) passes the reference
connectors and fails each broken one on exactly the obligations it breaks.

The plugin runs, through pytest's ``pytester``, on a test file written the way a
connector developer writes theirs (``CONTRACT``): the reference connectors of
``toolledger.kit.connectors`` and the deliberately broken variants:

- no dedup (the email client never sends the ``Idempotency-Key``);
- dedup without retention (a payments system that forgets keys long before the
  declared window);
- query-then-fence (a reconcile connector that reads the status, then fences);
- unknown answered as not applied (time-outs and resets raised as NotApplied);
- epoch-blind (a payments client that never sends the session owner's lease
  epoch, so a stale worker's request lands after a new owner announced its own);
- a real API's key answers misclassified: a 409 "in progress" taken for
  success, a "parameters differ" or a replayed failure re-sent under a fresh key.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from toolledger import Tool
from toolledger._core import ledger, next_step, protocol
from toolledger._core.ledger import Ledger
from toolledger._core.protocol import (
    RecoveryDecision,
    RecoveryInputs,
    SessionState,
    decide_recovery,
)
from toolledger.extra.pytest import (
    OBLIGATIONS,
    Connector,
    Obligation,
    obligations_for,
    obligations_table,
)

pytest_plugins = ("pytester",)


@pytest.fixture(autouse=True)
def _plugin_in_pytester_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process pytester runs load the plugin as an installed one would be:
    `make test` disables auto-loading (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1), so it
    is named in PYTEST_PLUGINS, which pytest reads at every start."""
    monkeypatch.setenv("PYTEST_PLUGINS", "toolledger.extra.pytest")

CONTRACT = '''
import pytest
from toolledger import Tool
from toolledger.extra.pytest import Connector
from toolledger.kit.connectors import (
    ConflictAsAppliedEmailClient, EmailClient, EmailServer, EpochBlindPaymentsClient,
    FreshKeyOnMismatchEmailClient, FreshKeyOnReplayedFailureEmailClient, PaymentsClient,
    PaymentsFake,
    QueryThenFencePaymentsClient, UnknownAsNotAppliedEmailClient,
)

EMAIL = Tool(policy="idempotent", marks_send=True)
WINDOW = 0.25


def email_connector(client_type, **kw):
    with EmailServer() as server:
        yield Connector(call=client_type(server.port, **kw).send, sandbox=server,
                        arguments={"to": "ada", "body": "the report"})


@pytest.fixture
def email():
    yield from email_connector(EmailClient)


@pytest.fixture
def email_no_dedup():
    yield from email_connector(EmailClient, send_key=False)


@pytest.fixture
def email_unknown_as_not_applied():
    yield from email_connector(UnknownAsNotAppliedEmailClient)


@pytest.fixture
def email_conflict_as_applied():
    yield from email_connector(ConflictAsAppliedEmailClient)


@pytest.fixture
def email_fresh_key_on_mismatch():
    yield from email_connector(FreshKeyOnMismatchEmailClient)


@pytest.fixture
def email_fresh_key_on_replayed_failure():
    yield from email_connector(FreshKeyOnReplayedFailureEmailClient)


def payments_connector(tmp_path, client_type=PaymentsClient, retention_window=None):
    fake = PaymentsFake(tmp_path / "payments.sqlite3", retention_window=retention_window)
    client = client_type(fake)
    return Connector(call=client.charge, reconcile=client.reconcile, sandbox=fake,
                     announce_epoch=client.announce_epoch)


@pytest.fixture
def payments(tmp_path):
    return payments_connector(tmp_path, retention_window=WINDOW)


@pytest.fixture
def payments_short_retention(tmp_path):
    return payments_connector(tmp_path, retention_window=WINDOW / 10)


@pytest.fixture
def payments_query_then_fence(tmp_path):
    return payments_connector(tmp_path, QueryThenFencePaymentsClient)


@pytest.fixture
def payments_epochs(tmp_path):
    return payments_connector(tmp_path)


@pytest.fixture
def payments_epoch_blind(tmp_path):
    return payments_connector(tmp_path, EpochBlindPaymentsClient)


@pytest.mark.connector_contract(EMAIL)
def test_email(obligation, email):
    obligation.check(email)


@pytest.mark.connector_contract(Tool(policy="manual", marks_send=True))
def test_email_manual(obligation, email):
    obligation.check(email)


@pytest.mark.connector_contract(EMAIL)
def test_email_no_dedup(obligation, email_no_dedup):
    obligation.check(email_no_dedup)


@pytest.mark.connector_contract(EMAIL)
def test_email_unknown_as_not_applied(obligation, email_unknown_as_not_applied):
    obligation.check(email_unknown_as_not_applied)


@pytest.mark.connector_contract(EMAIL)
def test_email_conflict_as_applied(obligation, email_conflict_as_applied):
    obligation.check(email_conflict_as_applied)


@pytest.mark.connector_contract(EMAIL)
def test_email_fresh_key_on_mismatch(obligation, email_fresh_key_on_mismatch):
    obligation.check(email_fresh_key_on_mismatch)


@pytest.mark.connector_contract(EMAIL)
def test_email_fresh_key_on_replayed_failure(obligation, email_fresh_key_on_replayed_failure):
    obligation.check(email_fresh_key_on_replayed_failure)


@pytest.mark.connector_contract(Tool(policy="idempotent"), retention_window=WINDOW)
def test_payments(obligation, payments):
    obligation.check(payments)


@pytest.mark.connector_contract(Tool(policy="idempotent"), retention_window=WINDOW)
def test_payments_short_retention(obligation, payments_short_retention):
    obligation.check(payments_short_retention)


@pytest.mark.connector_contract(Tool(policy="reconcile"))
def test_payments_reconcile(obligation, payments):
    obligation.check(payments)


@pytest.mark.connector_contract(Tool(policy="reconcile"))
def test_payments_query_then_fence(obligation, payments_query_then_fence):
    obligation.check(payments_query_then_fence)


@pytest.mark.connector_contract(Tool(policy="manual"), epoch_aware=True)
def test_payments_epochs(obligation, payments_epochs):
    obligation.check(payments_epochs)


@pytest.mark.connector_contract(Tool(policy="manual"), epoch_aware=True)
def test_payments_epoch_blind(obligation, payments_epoch_blind):
    obligation.check(payments_epoch_blind)
'''

# Which obligations each connector must fail (the rest of its suite passes).
EXPECTED_FAILURES: dict[str, set[str]] = {
    "test_email": set(),
    "test_email_manual": set(),
    "test_payments": set(),
    "test_payments_reconcile": set(),
    "test_payments_epochs": set(),
    "test_payments_epoch_blind": {
        "ExternalDrop-older_epoch_refused-NoReinvokeAfterKnownOutcome",
    },
    "test_email_no_dedup": {
        "ExternalApply-duplicate_applies_once-AtMostOnceEffect",
        "ExternalApplyLoseAnswer-retry_applies_once-AtMostOnceEffect",
        "ExternalApply-concurrent_duplicates_apply_once-AtMostOnceEffect",
        # the retry without a key is applied again beside the stored failure's effect
        "ExternalReplayFailure-replayed_failure_is_unknown-AtMostOnceEffect",
    },
    "test_payments_short_retention": {
        "ExternalApply-dedup_within_retention_window-AtMostOnceEffect",
    },
    "test_payments_query_then_fence": {
        "ExternalDropFenced-query_and_fence_atomic-AtMostOnceEffect",
    },
    "test_email_unknown_as_not_applied": {
        "ExternalApplyLoseAnswer-reset_is_unknown-ResultFidelity",
        "ExternalApplyLoseAnswer-timeout_is_unknown-ResultFidelity",
        "ExternalApply-late_original_is_unknown-ResultFidelity",
        # the reset is recorded as a failure, so the engine never retries
        "ExternalApplyLoseAnswer-retry_applies_once-AtMostOnceEffect",
        # the same: the key answers' obligations start from a time-out or a reset
        "ExternalAnswerInFlight-in_flight_is_unknown-ResultFidelity",
        "ExternalAnswerParamsDiffer-params_differ_is_unknown-AtMostOnceEffect",
    },
    # a real API's key answers (docs/protocol.md#real-apis-answers)
    "test_email_conflict_as_applied": {
        "ExternalAnswerInFlight-in_flight_is_unknown-ResultFidelity",
    },
    "test_email_fresh_key_on_mismatch": {
        "ExternalAnswerParamsDiffer-params_differ_is_unknown-AtMostOnceEffect",
    },
    "test_email_fresh_key_on_replayed_failure": {
        "ExternalReplayFailure-replayed_failure_is_unknown-AtMostOnceEffect",
    },
}

MANUAL = {ob.id for ob in obligations_for(Tool(policy="manual"))}
IDEMPOTENT = {ob.id for ob in obligations_for(Tool(policy="idempotent"))}
WINDOWED = {ob.id for ob in obligations_for(Tool(policy="idempotent"), 0.25)}
RECONCILE = {ob.id for ob in obligations_for(Tool(policy="reconcile"))}
EPOCHS = {ob.id for ob in obligations_for(Tool(policy="manual"), epoch_aware=True)}
SUITE = {
    "test_email": IDEMPOTENT,
    "test_email_manual": MANUAL,
    "test_email_no_dedup": IDEMPOTENT,
    "test_email_unknown_as_not_applied": IDEMPOTENT,
    "test_email_conflict_as_applied": IDEMPOTENT,
    "test_email_fresh_key_on_mismatch": IDEMPOTENT,
    "test_email_fresh_key_on_replayed_failure": IDEMPOTENT,
    "test_payments": WINDOWED,
    "test_payments_short_retention": WINDOWED,
    "test_payments_reconcile": RECONCILE,
    "test_payments_query_then_fence": RECONCILE,
    "test_payments_epochs": EPOCHS,
    "test_payments_epoch_blind": EPOCHS,
}


def _split(nodeid: str) -> tuple[str, str]:
    name = nodeid.split("::")[-1]
    func, _, rest = name.partition("[")
    return func, rest.rstrip("]")


@pytest.fixture(scope="module")
def contract_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Run the generated suites once for the module (in a subprocess, as a developer
    would): the outcome per connector and obligation, and each failure's text."""
    folder = tmp_path_factory.mktemp("contract")
    (folder / "test_connectors.py").write_text(CONTRACT, encoding="utf-8")
    # Only this plugin (loaded with -p): the run does not pay for every installed one.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "toolledger.extra.pytest", "-p",
         "no:cacheprovider", "-q", "--junitxml", str(folder / "report.xml"),
         str(folder / "test_connectors.py")],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    outcomes: dict[str, dict[str, str]] = {}
    messages: dict[str, str] = {}
    root = ET.parse(folder / "report.xml").getroot()
    for case in root.iter("testcase"):
        func, ob = _split(case.get("name", ""))
        failure = case.find("failure")
        error = case.find("error")
        if error is not None:
            outcome = "error"
        elif failure is not None:
            outcome = "failed"
            messages[f"{func}[{ob}]"] = (failure.get("message") or "") + (failure.text or "")
        else:
            outcome = "passed"
        outcomes.setdefault(func, {})[ob] = outcome
    assert outcomes, f"no test ran:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return outcomes, messages


@pytest.mark.parametrize("connector", sorted(EXPECTED_FAILURES))
def test_each_connector_fails_exactly_the_obligations_it_breaks(
    contract_run: tuple[dict[str, dict[str, str]], dict[str, str]], connector: str
) -> None:
    outcomes, _ = contract_run
    got = outcomes[connector]
    assert set(got) == SUITE[connector], "the generated suite is the policy's obligations"
    assert "error" not in got.values(), got
    failed = {ob for ob, outcome in got.items() if outcome == "failed"}
    assert failed == EXPECTED_FAILURES[connector]


def test_a_failure_names_the_obligation_the_action_and_the_invariant(
    contract_run: tuple[dict[str, dict[str, str]], dict[str, str]],
) -> None:
    _, messages = contract_run
    text = messages["test_email_no_dedup[ExternalApply-duplicate_applies_once-AtMostOnceEffect]"]
    broke = "connector broke obligation ExternalApply-duplicate_applies_once-AtMostOnceEffect"
    assert broke in text
    assert "2 effects after 2 requests with one idempotency key, expected 1" in text
    assert "depends on it: AtMostOnceEffect" in text
    text = messages[
        "test_payments_query_then_fence[ExternalDropFenced-query_and_fence_atomic-AtMostOnceEffect]"
    ]
    assert "promise (ExternalDropFenced" in text and "one atomic step" in text
    # the plugin's own frames are not shown: the message is the report
    assert "def _query_and_fence_atomic" not in text


def test_collect_only_lists_obligation_named_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_c=CONTRACT)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "test_c.py::test_email[ExternalApply-duplicate_applies_once-AtMostOnceEffect]" in out
    assert ("test_c.py::test_payments[ExternalExpireKey-retry_after_window_halts-"
            "AtMostOnceEffect]") in out
    assert "test_email[ExternalExpireKey" not in out  # no window declared: no expiry
    assert "test_payments_reconcile[ExternalDropFenced-query_and_fence_atomic" in out
    assert "test_email[ExternalDropFenced" not in out  # idempotent: no fence obligations
    assert "test_payments_epochs[ExternalDrop-older_epoch_refused" in out
    assert "test_email[ExternalDrop-older_epoch" not in out  # not declared epoch_aware
    assert f"{sum(len(s) for s in SUITE.values())} tests collected" in out


def test_every_spec_external_action_has_obligations() -> None:
    actions = {ob.action for ob in OBLIGATIONS}
    assert actions == {"ExternalApply", "ExternalApplyLoseAnswer", "ExternalRejectDefinite",
                       "ExternalDropFenced", "ExternalExpireKey", "ExternalDrop",
                       "ExternalAnswerInFlight", "ExternalAnswerParamsDiffer",
                       "ExternalReplayFailure"}
    with open(os.path.join(os.path.dirname(__file__), "..", "spec",
                           "DurableToolExecution.tla"), encoding="utf-8") as f:
        spec = f.read()
    with open(os.path.join(os.path.dirname(__file__), "..", "spec",
                           "ConcurrentResumers.tla"), encoding="utf-8") as f:
        concurrent = f.read()  # the stale-epoch drop is the concurrent spec's
    assert "ExternalDrop(r) ==" in concurrent
    for action in actions - {"ExternalDrop"}:  # every action named is the spec's
        assert f"{action}(e) ==" in spec, action
    for invariant in {ob.invariant for ob in OBLIGATIONS}:
        assert f"\n{invariant} ==" in spec, invariant


def test_docs_link_every_obligation_to_an_assumption() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text(
        encoding="utf-8")
    section = docs.split("### Checking a connector against these assumptions", 1)[1]
    section = section.split("\n## ", 1)[0]
    for ob in OBLIGATIONS:
        assert f"`{ob.action}-{ob.name}`" in section, ob.id
        row = next(line for line in section.splitlines() if f"`{ob.action}-{ob.name}`" in line)
        assert ob.invariant in row.rsplit("|", 2)[1], (ob.id, row)


def test_installed_as_a_pytest11_plugin_and_loadable_with_p(
    pytester: pytest.Pytester,
) -> None:
    names = {ep.value for ep in entry_points(group="pytest11")}
    assert "toolledger.extra.pytest" in names
    pytester.makepyfile(test_c=CONTRACT)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_PLUGINS"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    base = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
            "--strict-markers", "test_c.py"]
    without = subprocess.run(base, cwd=pytester.path, env=env, capture_output=True,
                             text=True, check=False)
    assert "'connector_contract' not found in `markers`" in without.stdout + without.stderr
    with_p = subprocess.run([*base, "-p", "toolledger.extra.pytest"], cwd=pytester.path,
                            env=env, capture_output=True, text=True, check=False)
    assert with_p.returncode == 0, with_p.stdout + with_p.stderr
    assert "test_email[ExternalApply-duplicate_applies_once-AtMostOnceEffect]" in with_p.stdout


@pytest.mark.parametrize(
    ("marker", "complaint"),
    [
        ("Tool(policy='readonly')", "a readonly tool has no side effect"),
        ("Tool(policy='idempotent'), retention_window=0", "must be a positive number"),
        ("Tool(policy='reconcile'), retention_window=1.0", "retention_window is the "
         "idempotency key's"),
        ("'idempotent', 'extra'", "expected @pytest.mark.connector_contract"),
    ],
)
def test_a_wrong_marker_is_a_usage_error_naming_the_fix(
    pytester: pytest.Pytester, marker: str, complaint: str
) -> None:
    pytester.makepyfile(f"""
        import pytest
        from toolledger import Tool
        @pytest.mark.connector_contract({marker})
        def test_x(obligation):
            pass
    """)
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert complaint in result.stdout.str() + result.stderr.str()


def test_a_marked_test_without_obligation_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        @pytest.mark.connector_contract("idempotent")
        def test_x():
            pass
    """)
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert "takes no 'obligation' argument" in result.stdout.str() + result.stderr.str()


def _external_expire_key(db: Path) -> tuple[Obligation, Connector]:
    from toolledger.extra import pytest as kit
    from toolledger.kit.connectors import PaymentsClient, PaymentsFake

    fake = PaymentsFake(db, retention_window=0.05)
    connector = kit.Connector(call=PaymentsClient(fake).charge, sandbox=fake)
    [expire] = [ob.bind(Tool(policy="idempotent"), 0.05) for ob in OBLIGATIONS
                if ob.action == "ExternalExpireKey"]
    return expire, connector


def _broken_decide(inputs: RecoveryInputs) -> RecoveryDecision:
    # BROKEN core: recovery ignores whether the key is still retained
    return RecoveryDecision(decide_recovery(replace(inputs, key_retained=True)).decision,
                            inputs)


def _passes_no_window(self: Ledger, state: SessionState) -> SessionState:
    # BROKEN ledger: it never applies a passed retention window (RetentionWindowPasses)
    return state


@pytest.mark.parametrize(
    "broken",
    [
        # Decide is called where the Session plans (next_step), the ledger audits
        # and the Recover handler applies: broken in all three, as one core would be
        [(protocol, "decide_recovery", _broken_decide), (ledger, "decide_recovery", _broken_decide),
         (next_step, "decide_recovery", _broken_decide)],
        [(ledger.Ledger, "_windows_passed", _passes_no_window)],
    ],
    ids=["decide_ignores_key_retained", "ledger_never_passes_the_window"],
)
def test_a_core_that_retries_after_the_window_fails_external_expire_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: list[tuple[object, str, object]]
) -> None:
    """The obligation runs the core's own path (Tool(retention_window=...), the
    ledger's dispatch time and clock, Recover's key_retained): the real core
    halts, and a core broken in either half retries and fails it."""
    expire, connector = _external_expire_key(tmp_path / "kept.sqlite3")
    expire.check(connector)  # the real core halts for a human: kept
    for target, name, value in broken:
        monkeypatch.setattr(target, name, value)
    expire, connector = _external_expire_key(tmp_path / "broken.sqlite3")
    with pytest.raises(pytest.fail.Exception) as failed:
        expire.check(connector)
    text = str(failed.value)
    assert "connector broke obligation ExternalExpireKey-retry_after_window_halts" in text
    assert "the recovery decision is retry_same_id" in text
    assert "depends on it: AtMostOnceEffect" in text


def test_external_expire_key_moves_the_engine_clock_not_the_wall_clock(tmp_path: Path) -> None:
    """With a sandbox that has advance(), the window passes for the engine's ledger
    through the same advance: the obligation waits for nothing."""
    expire, connector = _external_expire_key(tmp_path / "payments.sqlite3")
    # a 30 s window: waiting it out (the engine on the wall clock) takes 33 s
    expire = dataclasses.replace(expire, retention_window=30.0)
    started = time.monotonic()
    expire.check(connector)
    assert time.monotonic() - started < 15


CONNECTOR_SECTION = (Path(__file__).resolve().parent.parent / "docs" / "connectors.md"
                     ).read_text(encoding="utf-8")  # docs/connectors.md, the README links it


def test_readme_obligations_table_is_generated_from_the_catalogue() -> None:
    block = CONNECTOR_SECTION.split("<!-- obligations:begin -->", 1)[1].split(
        "<!-- obligations:end -->", 1)[0]
    assert block.strip() == obligations_table(), (
        "docs/connectors.md's obligations table drifted from "
        "toolledger.extra.pytest.OBLIGATIONS: paste "
        "the output of toolledger.extra.pytest.obligations_table() between the markers"
    )


def test_readme_plugin_in_10_lines_runs_the_idempotent_suite(pytester: pytest.Pytester) -> None:
    code = CONNECTOR_SECTION.split("```python", 1)[1].split("```", 1)[0]
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 10, f"docs/connectors.md's plugin example has {len(lines)} lines"
    pytester.makepyfile(test_readme_connector=code)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=len(WINDOWED))


def test_readme_failure_example_is_what_the_plugin_prints(
    contract_run: tuple[dict[str, dict[str, str]], dict[str, str]],
) -> None:
    _, messages = contract_run
    text = messages["test_email_no_dedup[ExternalApply-duplicate_applies_once-AtMostOnceEffect]"]
    example = CONNECTOR_SECTION.split("connector broke obligation", 1)[1].split("```", 1)[0]
    for line in ("connector broke obligation" + example).strip().splitlines():
        assert line.strip() in text, line


def test_a_connector_without_a_usable_sandbox_is_refused_naming_what_is_missing() -> None:
    from toolledger import InvalidInput
    from toolledger.extra.pytest import Connector

    class CountsOnly:
        def effects(self, execution_id: str) -> int:
            return 0

    with pytest.raises(InvalidInput, match=r"has no inject\(\), deliver_late\(\)"):
        Connector(call=lambda a: "ok", sandbox=CountsOnly())  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="must be the tool body"):
        Connector(call="send", sandbox=CountsOnly())  # type: ignore[arg-type]
