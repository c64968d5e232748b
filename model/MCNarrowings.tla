---------------------------- MODULE MCNarrowings ----------------------------
(***************************************************************************)
(* Bound twins of spec/DurableToolExecution.tla (model/clauses.toml, the   *)
(* "first" narrowing of i \in invocations[c]: the first value alone, TLC's *)
(* smallest invocation <<id, attempt, auth>>).  IdFromPosition re-derives  *)
(* the id after a renumbering: every invocation sent before it is then     *)
(* under an older, smaller id (the turn only grows), so its violations     *)
(* always hold the first value.  RetryIdFromPosition keeps the stored id  *)
(* and makes IdFromPosition's mistake in the request of a retry only,      *)
(* once attempt 1 was sent: attempt 1 went out under the stored id <<T,..>> *)
(* and the retry under the renumbered position's <<T+1,..>>, a later value: *)
(* with the bound narrowed to its first value the twin passes.             *)
(***************************************************************************)
EXTENDS MCRenumbered

\* EngineInvokeAdapter, the id of the request re-derived for a retry after
\* a sent attempt.
EngineInvokeRetryDerived(c) ==
    LET e == IF invocations[c] # {} THEN DerivedId(c) ELSE ExecId(c) IN
    /\ stage[c] = "dispatched"
    /\ inflight' = [inflight EXCEPT ![e] = @ \cup {Rec(c).attempt}]
    /\ invocations' = [invocations EXCEPT ![c] =
                         @ \cup {<<e, Rec(c).attempt, Rec(c).auth>>}]
    /\ sent' = [sent EXCEPT ![c][Rec(c).attempt] = @ + 1]
    /\ sentAfterOutcome' = [sentAfterOutcome EXCEPT ![c] =
                              IF c \in knownOutcome THEN @ + 1 ELSE @]
    /\ stage' = [stage EXCEPT ![c] = "waiting"]
    /\ UNCHANGED durable /\ UNCHANGED fenced
    /\ UNCHANGED <<applied, humanApproved, humanRetries, crashes>>
    /\ UNCHANGED <<knownOutcome, decided>>
    /\ UNCHANGED positions
    /\ UNCHANGED extVars
=============================================================================
