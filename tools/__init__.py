"""Development tools: not shipped, not run by `pulumi up`; the product's packages never import them.

- `python -m tools docs` rewrites every generated region of the documents from the code
  (`--check` only says which are stale); `tools/docs.py` lists them.
- `tools/layers.py` declares who may import whom (enforced by `tests/test_layers.py`).
"""
