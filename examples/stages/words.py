#!/usr/bin/env python3
# A PEPSI stage in Python with the standard library only (pepsi.conf: INPUT =
# message). Each line on stdin is one message as JSON; answer one line per
# message, in order, and flush it. It counts the payload's words and moves the
# message on to stage "finish" with the count merged into its state.
import json, sys

for line in sys.stdin:
    msg = json.loads(line)
    words = len(msg.get("payload", "").split())
    patch = json.dumps({"words": words}, separators=(",", ":"))
    print("0 >finish " + patch, flush=True)  # stdout carries answers only
