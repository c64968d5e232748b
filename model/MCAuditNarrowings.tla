-------------------------- MODULE MCAuditNarrowings --------------------------
(***************************************************************************)
(* Bound twins of spec/DurableToolExecution.tla's audit invariants         *)
(* (model/clauses.toml: the narrowings of d \in decided[c] and of          *)
(* row \in audit[e]).  TLC orders a set of rows <<kind, attempt, inputs>>  *)
(* by kind first, and strings in the order TLC first meets them in the     *)
(* spec, not alphabetically: "reconcile" (in Policies) before              *)
(* "recovery_required" (in Statuses) before "execute", "reconstruct",      *)
(* "retry_same_id", "skip", then "dispatch" and the other non-decision     *)
(* kinds.  A reconcile decision's row is thus the first of every set it   *)
(* is in; the first two twins take one reconcile call with one attempt,   *)
(* so that a call takes that decision for one attempt only.                *)
(*                                                                         *)
(* AuditSkipsReconcile drops the reconcile decision's row: AuditComplete   *)
(* fails at the first value of decided[c] only.  AuditReconcileUnread      *)
(* gives the reconcile decision's row the inputs of a call with no record: *)
(* AuditRecomputable fails at the first value of audit[e] only.            *)
(* ReHaltAbandonedReconcile (its .cfg: MCTwins' DecideReHaltsAbandoned on  *)
(* a reconcile call) halts an abandoned call again: a reconcile call is    *)
(* halted only after a reconcile decision, whose correct row sorts before  *)
(* the wrong halt row, so AuditRecomputable fails after the first value   *)
(* of audit[e] only.                                                       *)
(***************************************************************************)
EXTENDS MCTwins

(* AuditSkipsReconcile: Recover audits every decision but "reconcile".     *)
AuditSkipsReconcile(e, d, n, i) ==
    audit' = IF d = "reconcile" THEN audit
             ELSE [audit EXCEPT ![e] = @ \cup {<<d, n, i>>}]

(* AuditReconcileUnread: a reconcile decision's row records the inputs as  *)
(* if the record had not been read (status "none"), from which Decide      *)
(* recomputes "execute".                                                   *)
AuditReconcileUnread(e, d, n, i) ==
    LET row == IF d = "reconcile" THEN [i EXCEPT !.status = "none"] ELSE i IN
    audit' = [audit EXCEPT ![e] = @ \cup {<<d, n, row>>}]
=============================================================================
