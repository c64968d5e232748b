-------------------- MODULE MCSameTurn --------------------
(***************************************************************************)
(* Two calls of ONE assistant message (turn 1, slots 0 and 1), both with   *)
(* the provider id "" (an OpenAI stream without ids): a manual call that   *)
(* needs approval and an idempotent call that needs none (auto); no crash. *)
(* Both may be in progress at once, as in openworker (all calls of a       *)
(* message are persisted and authorized before the first is dispatched).   *)
(* Live time-outs still send both calls through Recover; with one crash    *)
(* the model has 130k states, too many for the CI budget.                  *)
(* Every constant is a literal: the Python checkers read them from here.   *)
(***************************************************************************)
EXTENDS DurableToolExecution

MCCalls == {"c1", "c2"}
MCTurn == [c1 |-> 1, c2 |-> 1]
MCSlot == [c1 |-> 0, c2 |-> 1]
MCToolCallId == [c1 |-> "", c2 |-> ""]
MCPolicy == [c1 |-> "manual", c2 |-> "idempotent"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a2"}]
MCMarkerTurn == 0
MCMaxCrashes == 0
MCMaxAttempts == 2
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE

(***************************************************************************)
(* Witnesses: each is the negation of a situation this model must reach;  *)
(* a witness model checks one of them and must find it violated, so a     *)
(* change that makes the situation unreachable fails `toolledger check`.  *)
(***************************************************************************)
\* two calls of one message both dispatched, neither answered
WitnessTwoInFlight ==
    ~\E c, d \in Calls :
        /\ c # d /\ Turn[c] = Turn[d]
        /\ Rec(c).status = "dispatched" /\ Rec(d).status = "dispatched"
        /\ result[c] = NoResult /\ result[d] = NoResult
\* Its .cfg writes decision rows without their inputs
\* (RowInputs <- WithoutInputs), which keeps the model at its size;
\* AuditRecomputable is checked on the models whose rows carry the inputs.
MCDecisionRowsWithInputs == FALSE
=============================================================================
