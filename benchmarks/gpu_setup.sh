# Sourced on a GPU machine (no network): optuna and pydantic from the carried .whl/, this tree installed.
# The copy's .git may be stale: a caller names the commit it sent with GIT_SHA, and the tree is then that commit as
# committed (GIT_DIRTY=0, unless given), so the records do not say "with uncommitted changes" of a clean tree.
[ -n "${GIT_SHA:-}" ] && export GIT_DIRTY=${GIT_DIRTY:-0}
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
