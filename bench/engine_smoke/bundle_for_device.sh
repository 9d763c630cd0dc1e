#!/usr/bin/env bash
# Copies this worktree's committed autotune, bench, search_spaces and pyproject.toml, plus .whl/, into
# /work/main/.gpu-ttmoe (git-ignored there by /.gpu*/): the device tool sends the session's checkout
# (/work/main), not a helper's worktree, so the run carries this folder and works inside it.
set -euo pipefail
D=/work/main/.gpu-ttmoe
rm -rf "$D"; mkdir -p "$D"
git archive HEAD autotune bench search_spaces pyproject.toml | tar -x -C "$D"
cp -r .whl "$D/.whl"
du -sh "$D"
