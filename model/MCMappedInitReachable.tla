------------------------ MODULE MCMappedInitReachable ------------------------
(***************************************************************************)
(* Is the refinement's initial state a state of the main spec?  The       *)
(* concurrent Init (four states: no record yet; attempt 1 dispatched with *)
(* nothing sent, in flight, or applied) is not the main spec's Init, so   *)
(* MCConcurrentRefinesMain's StepsRefine alone does not tie the two specs *)
(* (docs/protocol.md#concurrent-resumers).  Here the concurrent           *)
(* variables stay at one initial state (Pick(Which)) while a copy of the  *)
(* main spec (M, its own variables, the refinement's constants) runs its  *)
(* Next from its Init: Witness_MappedInitReachable is violated when M     *)
(* reaches the mapped state Main!vars.  One model per initial state       *)
(* (MappedInitReachable1..4);  tests/test_refinement_init.py runs the     *)
(* other policies and the control HInitNoCrash (lost = 0: two mapped      *)
(* states are not reached, as the refinement's first mapping had it).     *)
(***************************************************************************)
EXTENDS MCConcurrentRefinesMain

CONSTANT Which  \* 1..4: which initial state of the concurrent spec
VARIABLES m_msg, m_args, m_result, m_approval, m_approvalArgs, m_ledger, m_audit,
          m_marker, m_stage, m_inflight, m_fenced, m_applied, m_invocations,
          m_humanApproved, m_humanRetries, m_crashes, m_sent, m_knownOutcome,
          m_sentAfterOutcome, m_decided, m_turnOf, m_storedId, m_renumbers,
          m_repairs, m_effects, m_windowPassed, m_keyForgotten, m_droppedAnswers
(* The main spec again, on variables of its own (Main's constants). *)
M == INSTANCE DurableToolExecution WITH
    Calls <- {TheCall},
    Turn <- [c \in {TheCall} |-> 1],
    Slot <- [c \in {TheCall} |-> 1],
    ToolCallId <- [c \in {TheCall} |-> "t1"],
    Policy <- [c \in {TheCall} |-> Pol],
    NeedsApproval <- [c \in {TheCall} |-> NeedsApproval],
    ArgChoices <- [c \in {TheCall} |-> {TheArgs}],
    MarkerTurn <- 0,
    MaxCrashes <- 1 + MaxCrashes + 2 * MaxEpoch,
    MaxAttempts <- MaxAttempts,
    KeyByPosition <- TRUE,
    FenceOnReconcile <- TRUE,
    msg <- m_msg, args <- m_args, result <- m_result, approval <- m_approval,
    approvalArgs <- m_approvalArgs, ledger <- m_ledger, audit <- m_audit,
    marker <- m_marker, stage <- m_stage, inflight <- m_inflight, fenced <- m_fenced,
    applied <- m_applied, invocations <- m_invocations, humanApproved <- m_humanApproved,
    humanRetries <- m_humanRetries, crashes <- m_crashes, sent <- m_sent,
    knownOutcome <- m_knownOutcome, sentAfterOutcome <- m_sentAfterOutcome,
    decided <- m_decided, turnOf <- m_turnOf, storedId <- m_storedId,
    renumbers <- m_renumbers, repairs <- m_repairs, effects <- m_effects,
    windowPassed <- m_windowPassed, keyForgotten <- m_keyForgotten,
    droppedAnswers <- m_droppedAnswers
mvars == M!vars
(* The four initial states, one each (MappedInitPartition checks that     *)
(* every initial state is picked by exactly one k).                       *)
Pick(k) ==
    CASE k = 1 -> rec = NoRecord
      [] k = 2 -> rec # NoRecord /\ sent[1] = 0
      [] k = 3 -> rec # NoRecord /\ sent[1] = 1 /\ applied = 0
      [] k = 4 -> applied = 1
(* PickedOnce: every initial state is named by exactly one Pick(k).      *)
PickedOnce == Cardinality({k \in 1..4 : Pick(k)}) = 1
PartitionSpec == HInit /\ M!Init /\ [][FALSE]_<<vars, hist, mvars>>

(* Control: the refinement's first mapping, which counted no crash before *)
(* the concurrent Init.                                                    *)
HInitNoCrash == Init /\ parked = {} /\ lost = 0 /\ resent = 0

PSpec == HInit /\ Pick(Which) /\ M!Init
         /\ [][M!Next /\ UNCHANGED <<vars, hist>>]_<<vars, hist, mvars>>
(* Witness_MappedInitReachable: the main spec's copy is not (yet) at the *)
(* mapped initial state; violated when the main spec reaches it.          *)
Witness_MappedInitReachable == mvars # Main!vars
=============================================================================
