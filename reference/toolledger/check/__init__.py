"""What a maintainer runs to tie the reference to the TLA+ spec.

``toolledger check`` (:mod:`toolledger.cli`) drives these: ``tlc`` (the TLC
runner and its output parser), ``tlavalues`` (TLA+ values), ``stategraph``
(TLC's state graph dumps), ``manifest`` (``model/manifest.toml``), ``system``
and ``mapping`` (the spec's state and its mapping to the Python state),
``conformance`` (the reference against every state and edge of a model),
``tracecheck`` and ``kittrace`` (trace validation of recorded runs),
``invariants`` (the spec's invariants over Python states) and
``counterexample`` (a counterexample as a readable step table).  An engine never
imports this package; it needs the ``check`` extra for TLC.
"""
