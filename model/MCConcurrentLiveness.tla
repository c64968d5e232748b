------------------------ MODULE MCConcurrentLiveness ------------------------
(***************************************************************************)
(* EventuallyAnswered for two resumers (spec/ConcurrentResumers.tla's     *)
(* FairSpec), with the takeovers bounded so that the bound never strands  *)
(* the call: a process may take a session another one runs (a steal) only *)
(* while epoch < MCStealEpochs, and MaxEpoch leaves an epoch for the       *)
(* Restart after the crash (a refused stale worker goes idle beside the    *)
(* owner, so it needs none).  The bound is the model's, not the protocol's *)
(* (a real epoch has no maximum): with MaxEpoch 2 a steal and a crash      *)
(* leave a session nobody can take (tests/test_concurrent_liveness.py).   *)
(* docs/protocol.md#concurrent-resumers.                                  *)
(***************************************************************************)
EXTENDS MCConcurrentResumers

MCStealEpochs == 2   \* one steal: at epoch 1 (at epoch 0 nobody runs)
MCLiveMaxEpoch == 3  \* the first take, the steal, the Restart after the crash

StealBound ==
    (epoch' > epoch /\ \E q \in Procs : pc[q] # "idle") => epoch < MCStealEpochs
LiveSpec == Init /\ [][Next /\ StealBound]_vars /\ Fairness

(* Liveness twin ConcurrentLivenessRefusedReloads: a process the lease     *)
(* refuses reloads the store and decides again under its old epoch,        *)
(* instead of taking the session again: it never commits (every safety     *)
(* invariant holds), is never idle, and after the owner's crash nobody     *)
(* answers the call.  A copy of the spec's Refused but for pc, view and    *)
(* held (a cfg substitution replaces a name everywhere): change both.      *)
RefusedReloads(p) ==
    /\ CommitsNext(p) /\ ~CanCommit(p)
    /\ pc' = [pc EXCEPT ![p] = "resume"]
    /\ view' = [view EXCEPT ![p] = Stored]
    /\ refusals' = refusals \cup
                     {r \in {"cas", "epoch"} :
                        IF r = "cas" THEN UseCAS /\ ~CAS(p)
                                     ELSE UseLease /\ ~Current(p)}
    /\ UNCHANGED durable /\ UNCHANGED external /\ UNCHANGED held
    /\ UNCHANGED <<applied, sent, invocations, humanRetries, crashes,
                   staleCommits, staleDropped, knownOutcome, sentAfterOutcome,
                   droppedAfterOutcome, staleViewCommits>>
=============================================================================
