-------------------------- MODULE MCLegacyResume --------------------------
(***************************************************************************)
(* The seed's reproduction: one approved send_email call, one crash.      *)
(* Every constant is a literal: the Python checkers read them from here.  *)
(***************************************************************************)
EXTENDS LegacyResume

MCCalls == {"c1"}
MCMaxCrashes == 1
MCRecordSuccessFalse == FALSE
MCRecordSuccessTrue == TRUE
=============================================================================
