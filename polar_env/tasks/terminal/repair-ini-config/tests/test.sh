#!/bin/bash
# The Harbor verifier: run after the agent, from the task's workdir; the reward goes to
# /logs/verifier/reward.txt (1 when every check of test_outputs.py holds, else 0).
if python3 /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
