#!/usr/bin/env python3
# The stage of the outside check of ordering per key (orderkey_test.go), one
# program for stages a -> b -> c (PEPSI_STAGE), INPUT = message.
#
# It reads standard input without blocking, whenever bytes arrive, even while
# it works on an earlier message: a line the dispatcher wrote into the pipe is
# logged as received at once, not when the worker gets round to it, so two
# messages of one key in this worker's QUEUE_LIMIT window show as both
# received before the first is answered. Each worker logs to a file of its own
# in $KEYCHECK_LOG, one line per event, times from CLOCK_MONOTONIC (one clock
# for every process of the machine):
#
#   R <ns> <id> <attempts>   the line of message <id> was read (after the read)
#   A <ns> <id> <code>       message <id> is answered (before the answer is written)
#
# so the log's interval for a pass lies inside the dispatcher's: if the
# dispatcher never holds two of a key at once, no two logged intervals of a key
# overlap.
#
# The payload says what the message does: {"act": "STAGE:WHAT"} with WHAT one
# of pause (0 >paused:0.1 once), retry (75 on the first pass), fail (3) and
# exhaust (75 every pass, until RETRY_LIMIT fails it); anything else passes.
import collections, json, os, select, sys, time

stage = os.environ["PEPSI_STAGE"]
following = {"a": "b", "b": "c", "c": "done"}[stage]
log = open(os.path.join(os.environ["KEYCHECK_LOG"], "%s-%d.log" % (stage, os.getpid())), "w")


def answer(msg):
    act = json.loads(msg.get("payload") or "{}").get("act", "")
    where, _, what = act.partition(":")
    if where == stage:
        if what == "pause" and not msg["state"].get("paused"):
            return "0 >paused:0.1 {\"paused\":1}"
        if what == "retry" and msg["attempts"] == 0:
            return "75 planned retry"
        if what == "fail":
            return "3 planned failure"
        if what == "exhaust":
            return "75 planned retry, every time"
    return "0 >" + following


def work_ns(msg):
    # A little work, different per message, so that the pipelines fill.
    return (msg["id"] % 4) * 250_000


fd = sys.stdin.fileno()
os.set_blocking(fd, False)
pending, window, eof, busy_until = b"", collections.deque(), False, None
while window or not eof:
    now = time.monotonic_ns()
    if window and busy_until is None:
        busy_until = now + work_ns(window[0])
    if window and now >= busy_until:
        msg = window.popleft()
        line = answer(msg)
        log.write("A %d %d %s\n" % (time.monotonic_ns(), msg["id"], line.split()[0]))
        os.write(1, (line + "\n").encode())
        busy_until = None
        continue
    wait = None if not window else (busy_until - now) / 1e9
    if eof:
        time.sleep(wait)
        continue
    if wait is None:
        log.flush()
    if not select.select([fd], [], [], wait)[0]:
        continue
    chunk = os.read(fd, 1 << 16)
    at = time.monotonic_ns()
    if not chunk:
        eof = True
        continue
    *lines, pending = (pending + chunk).split(b"\n")
    for raw in lines:
        msg = json.loads(raw)
        window.append(msg)
        log.write("R %d %d %d\n" % (at, msg["id"], msg["attempts"]))
log.close()
