------------------------ MODULE MCResponsePlacement ------------------------
(***************************************************************************)
(* The response-placement models (spec/ResponsePlacement.tla): the .cfgs   *)
(* pick the bounds, the environment and the design switches.  Every       *)
(* constant is a literal.                                                  *)
(***************************************************************************)
EXTENDS ResponsePlacement

MCIds == {"call_0", "call_1"}
MCArgVals == {"x", "y"}

(***************************************************************************)
(* Bound twin of NoAlias's h \in handed (model/clauses.toml, the "rest"    *)
(* narrowing: every value but TLC's first, the pair of the earliest call   *)
(* answered).  EngineDispatchRequestById, EngineDispatch's twin            *)
(* (RequestById.cfg): the engine joins the ledger's record of slot s back  *)
(* to the framework's call by provider id, through a map from id to call   *)
(* built over the response in slot order, where a later call with the same *)
(* id overwrites an earlier one: slot s's key carries the request of the   *)
(* LAST call of the response with s's provider id.  So with a provider id  *)
(* reused in one response an earlier call's key goes out first (and only)  *)
(* with a later call's request, and never the reverse: the earlier call is *)
(* handed the later call's effect, <<earlier, later>>; the later one its   *)
(* own.  With one emission the earlier call is intent 1, the earliest one  *)
(* answered, whose pair is the first value of handed (TLC orders pairs of  *)
(* integers by the first): narrowed to the rest, NoAlias holds.            *)
(***************************************************************************)
\* The slot whose request the engine sends for slot s of the response it acts on.
RequestSlot(s) ==
    LET calls == led[cur.n].calls
        same == {t \in DOMAIN calls : calls[t].pid = calls[s].pid}
    IN CHOOSE t \in same : \A u \in same : u <= t
EngineDispatchRequestById(s) ==
    /\ cur # NoCur /\ s \in DOMAIN cur.keys
    /\ LET k == cur.keys[s]
           i == cur.ints[RequestSlot(s)]
       IN /\ lstat[k] = "none"
          /\ lstat' = [lstat EXCEPT ![k] = "dispatched"]
          /\ dispatches' = dispatches \cup {<<i, k>>}
          /\ effectOf' = IF k \in DOMAIN effectOf THEN effectOf
                         ELSE (k :> i) @@ effectOf
    /\ UNCHANGED <<hist, saved, led, sup, bind, cur, lost, nextIntent,
                   keyIntents, handed, numbered, placedAfterTrim, placedBehind, emits, crashes, trims>>
=============================================================================
