"""Synthetic tokenizer and dataset for the engine smoke runs: :mod:`autotune.runners.assets` (moved there
so that the torchtitan runner writes them itself).

    python bench/engine_smoke/make_assets.py OUT_DIR [--docs 2000] [--vocab 8192]
"""

from autotune.runners.assets import main

if __name__ == "__main__":
    main()
