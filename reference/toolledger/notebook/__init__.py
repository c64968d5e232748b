"""Support for the notebooks in ``notebooks/``: not for engines.

``support`` and ``evidence`` (the runs and measurements the notebooks show),
``figures`` and ``figures_matrix`` (every figure, drawn by code), ``html``
(``make notebooks-html``) and ``kernel`` (the TLA+ Jupyter kernel,
``python -m toolledger.notebook.kernel install``).
"""
