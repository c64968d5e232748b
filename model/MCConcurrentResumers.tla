------------------------ MODULE MCConcurrentResumers ------------------------
(***************************************************************************)
(* Two engine processes resuming one session's protected call, one call   *)
(* per policy (the .cfgs pick the policy and the design switches).        *)
(* Every constant is a literal.                                            *)
(***************************************************************************)
EXTENDS ConcurrentResumers

MCProcs == {"p1", "p2"}
MCMaxAttempts == 2
MCMaxCrashes == 1
MCMaxEpoch == 2

(* The twins start from a crashed engine's dispatched attempt 1, so that  *)
(* the counterexample is the race on the recovery decision, not the       *)
(* simpler double first dispatch (which ResumeWithoutCASApproval shows).  *)
DispatchedSpec == Init /\ rec.status = "dispatched" /\ [][Next]_vars

(* EpochOnQueryOnly twin: the old rule, the epoch reaches the external     *)
(* side only with a request or a reconcile query (EpochOnTake = FALSE).    *)
MCEpochOnTakeOff == FALSE
=============================================================================
