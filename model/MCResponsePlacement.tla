------------------------ MODULE MCResponsePlacement ------------------------
(***************************************************************************)
(* The response-placement models (spec/ResponsePlacement.tla): the .cfgs   *)
(* pick the bounds, the environment and the design switches.  Every       *)
(* constant is a literal.                                                  *)
(***************************************************************************)
EXTENDS ResponsePlacement

MCIds == {"call_0", "call_1"}
MCArgVals == {"x", "y"}
=============================================================================
