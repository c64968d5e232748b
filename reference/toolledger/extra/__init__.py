"""Optional integrations of toolledger with agent frameworks.

Each module here imports its framework and is installed with an extra
(``pip install 'toolledger[pydantic-ai]'`` for :mod:`toolledger.extra.pydantic_ai`,
``pip install 'toolledger[langgraph]'`` for :mod:`toolledger.extra.langgraph`,
``toolledger[openai-agents]`` for :mod:`toolledger.extra.openai_agents`,
``toolledger[mcp]`` for :mod:`toolledger.extra.mcp` (MCP client sessions),
``toolledger[pytest]`` for :mod:`toolledger.extra.pytest`, the connector contract kit).
The core package never imports them: ``import toolledger`` works with no
third-party package installed.
"""
