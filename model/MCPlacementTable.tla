-------------------------- MODULE MCPlacementTable --------------------------
(***************************************************************************)
(* The placement rule of spec/ResponsePlacement.tla, tabulated: table      *)
(* holds Placement on every input of a small domain (the live responses:  *)
(* none, one of 1..2 calls, or two or three of one call, over two provider *)
(* ids and two arguments, each seen or not; every presented response of  *)
(* 1..2 calls) and SameCallSlots on every                                  *)
(* pool and re-emission of 1..2 calls.  One state: TLC checks that the     *)
(* rule gives exactly one answer on every input (PlacementTotalOnInputs),  *)
(* and tests/test_placement_conformance.py reads the table from the state  *)
(* graph and compares it with the Python's placement() and                 *)
(* same_call_slots() (reference/toolledger/_core/placement.py).            *)
(* The module is instantiated with its variables substituted: only its    *)
(* constant-level operators are used.                                      *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

VARIABLE table

P == INSTANCE ResponsePlacement WITH
        Ids <- {"call_0", "call_1"}, ArgVals <- {"x", "y"}, MaxSlots <- 2,
        MaxEmits <- 0, MaxCrashes <- 0, MaxTrims <- 0, SaveBeforeEmit <- TRUE,
        KeyFrom <- "ledger", UseSeen <- TRUE, SeqMonotone <- TRUE,
        AcceptReEmission <- TRUE, BindSameCall <- TRUE, AgainstLatestOnly <- FALSE,
        hist <- 0, saved <- 0, led <- 0, sup <- 0, lstat <- 0, bind <- 0, cur <- 0,
        lost <- 0, nextIntent <- 0, keyIntents <- 0, dispatches <- 0, effectOf <- 0,
        handed <- 0, numbered <- 0, placedAfterTrim <- 0, placedBehind <- 0, emits <- 0, crashes <- 0,
        trims <- 0

\* The live responses: none or one of 1..2 calls, or two or three of one call.
Live(S) == [calls : S, seen : BOOLEAN]
OneCall == {r \in P!Responses : Len(r) = 1}
LiveSeqs == {<<>>} \cup [1..1 -> Live(P!Responses)]
            \cup [1..2 -> Live(OneCall)] \cup [1..3 -> Live(OneCall)]
PlaceInputs == LiveSeqs \X P!Responses
SameInputs == P!SeqsUpTo({"x", "y"}, 2) \X UNION {[1..k -> {"x", "y"}] : k \in 1..2}

Init == table = [place |-> [i \in PlaceInputs |-> P!Placement(i[1], i[2])],
                 same |-> [j \in SameInputs |-> P!SameCallSlots(j[1], j[2])]]
Next == UNCHANGED table
Spec == Init /\ [][Next]_table

\* The rule gives exactly one answer on every input of the domain.
PlacementTotalOnInputs == \A i \in PlaceInputs : Cardinality(table.place[i]) = 1
=============================================================================
