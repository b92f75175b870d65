#!/usr/bin/env bash
# //:doc_links_test: every relative link and doc citation in README.md and
# docs/**/*.md resolves (docs/check_links.py; its data are the runfiles).
set -euo pipefail
exec python3 docs/check_links.py
