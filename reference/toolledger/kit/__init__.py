"""The demo kit: a small engine shaped like openworker that adopts toolledger.

``engine`` (the demo engine, the first adopter of :class:`toolledger.Session`),
``simulate`` (``toolledger simulate``: crash it anywhere, restart it, count
the effects) and ``external`` (a counting external system and its adapter).
Used by the tests, the benchmarks and the notebooks; an engine may read it as
an example, never import it.
"""
