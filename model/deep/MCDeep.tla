-------------------- MODULE MCDeep --------------------
(***************************************************************************)
(* The deep target: too big to enumerate, sampled by TLC's random          *)
(* simulation (`toolledger deep`, TLC -simulate, depth >= 100).  Three     *)
(* calls of every policy that can have an effect, in two turns, the third  *)
(* reusing call_0; 3 crashes, 3 attempts, keys that expire after their     *)
(* retention window.  It EXTENDS MCTwins so that a twin's operator can be *)
(* swapped in (`toolledger deep --override`): the target must find it.    *)
(* Every constant is a literal.                                            *)
(***************************************************************************)
EXTENDS MCTwins

MCCalls == {"c1", "c2", "c3"}
MCTurn == [c1 |-> 1, c2 |-> 1, c3 |-> 2]
MCSlot == [c1 |-> 0, c2 |-> 1, c3 |-> 0]
MCToolCallId == [c1 |-> "call_0", c2 |-> "call_1", c3 |-> "call_0"]
MCPolicy == [c1 |-> "manual", c2 |-> "idempotent", c3 |-> "reconcile"]
MCNeedsApproval == [c1 |-> TRUE, c2 |-> TRUE, c3 |-> FALSE]
MCArgChoices == [c1 |-> {"a1"}, c2 |-> {"a2", "a3"}, c3 |-> {"a1"}]
MCMarkerTurn == 0
MCMaxCrashes == 3
MCMaxAttempts == 3
MCKeyByPosition == TRUE
MCFenceOnReconcile == TRUE
MCKeysExpire == TRUE
=============================================================================
