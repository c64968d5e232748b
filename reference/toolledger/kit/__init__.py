"""The demo kit: a small engine shaped like openworker that adopts toolledger.

``engine`` (the demo engine, the first adopter of :class:`toolledger.Session`;
its steps and crash points in ``crash``, its provider, human and conversation
stores in ``world``),
``simulate`` (``toolledger simulate``: crash it anywhere, restart it, count
the effects), ``external`` (a counting external system and its adapter),
``frameworks`` (LangGraph and pydantic-ai agents SIGKILLed and resumed, alone and
with the ledger; the children import the frameworks, the module does not) and
``connectors`` (reference connectors that pass the connector contract kit,
:mod:`toolledger.extra.pytest`, and the broken variants it catches).
Used by the tests, the benchmarks and the notebooks; an engine may read it as
an example, never import it.
"""
