#!/bin/bash
# The Harbor verifier: writes /logs/verifier/reward.json with several keys: "reward" (1 when every
# region's total is right, else 0) and "regions_correct" (how many are).
python3 /tests/test_outputs.py
