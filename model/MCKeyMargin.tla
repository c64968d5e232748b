-------------------- MODULE MCKeyMargin --------------------
(***************************************************************************)
(* The key-retention margin twin, on the KeyExpiry model: the external     *)
(* system forgets a key as soon as the declared window passed, with no    *)
(* margin for a retry already on its way (ExternalExpireKey without its   *)
(* "nothing in flight, no retry held" guard).                              *)
(***************************************************************************)
EXTENDS MCKeyExpiry

ExpireKeyWithoutMargin(e) ==
    /\ e \in windowPassed /\ KeyRemembered(e)
    /\ keyForgotten' = keyForgotten \cup {e}
    /\ UNCHANGED durable /\ UNCHANGED stage /\ UNCHANGED external
    /\ UNCHANGED ghosts /\ UNCHANGED <<effects, windowPassed, droppedAnswers>>
    /\ UNCHANGED positions
=============================================================================
