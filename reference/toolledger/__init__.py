"""toolledger: crash-safe, side-effecting tool calls for AI-agent engines.

The protocol is specified in ``spec/DurableToolExecution.tla`` and checked by
TLC; this package is its reference implementation:

- :mod:`toolledger.protocol`: the pure, I/O-free state machine and
  :func:`~toolledger.protocol.decide_recovery`;
- :mod:`toolledger.ledger`, :mod:`toolledger.stores`,
  :mod:`toolledger.sqlite_store`: durable storage;
- :mod:`toolledger.engine`: an engine adoption kit shaped like openworker;
- :mod:`toolledger.system`, :mod:`toolledger.mapping`,
  :mod:`toolledger.invariants`, :mod:`toolledger.conformance`: the ties
  between code and spec used by the checkers.

Importing the package imports nothing else: pick the modules you need.
"""

__version__ = "0.1.0"
