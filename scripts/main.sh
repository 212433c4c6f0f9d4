#!/usr/bin/env bash
# The README's main job: set up, run the default simulation (the paper's
# setting: OPT-13B on one A100-40GB, chatbot workload, block size 16), then a
# short live validation of the simulator against the real engine on this CPU.
# The validation calibrates first (a quick profile): a shared CPU's speed drifts
# by 10-20% over tens of minutes, more than the accuracy being checked. Its
# 56 requests give a steady window long enough for its own verdict to judge,
# and each metric is judged against its target and against the 90% interval of
# 5 more simulations with the profile's timing noise (--seeds).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
planner simulate --workload chatbot --block-size 16 --policy paper
planner validate --gpu cpu --quick --reprofile
