"""Every model says what it proves and under which assumptions, and docs/models.md shows it.

docs/models.md's "what each model proves" list is generated from
``model/manifest.toml`` (:func:`toolledger.check.manifest.proves_markdown`):
it must match the manifest, and every CI model must state its assumptions
(the environment it models and its bounds), so that "make check passes" can
be read as the statement it is.
"""

from __future__ import annotations

from dataclasses import replace

from checker_support import ROOT
from toolledger.check.manifest import load_manifest, proves_markdown

MODELS_PAGE = (ROOT / "docs" / "models.md").read_text()


def test_every_ci_model_states_its_assumptions() -> None:
    missing = [m.name for m in load_manifest(ROOT).ci_models() if not m.assumptions.strip()]
    assert not missing, f"add assumptions = ... to these models in model/manifest.toml: {missing}"


def test_the_models_page_list_is_generated_from_the_manifest() -> None:
    block = MODELS_PAGE.split("<!-- proves:begin -->", 1)[1].split("<!-- proves:end -->", 1)[0]
    manifest = load_manifest(ROOT)
    assert block.strip() == proves_markdown(manifest), (
        "docs/models.md's list of what each model proves drifted from model/manifest.toml: "
        "paste the "
        "output of `toolledger models --proves` between the markers"
    )
    for m in manifest.models:  # one line per model, naming its assumptions
        line = next(x for x in block.splitlines() if x.startswith(f"- **`{m.name}`**"))
        assert m.assumptions in line


def test_a_model_without_assumptions_says_so() -> None:
    manifest = load_manifest(ROOT)
    bare = replace(manifest, models=(replace(manifest.models[0], assumptions=""),))
    assert proves_markdown(bare).endswith("Assumes: not stated.")
