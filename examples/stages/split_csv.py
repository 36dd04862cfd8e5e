#!/usr/bin/env python3
# A PEPSI stage in Python with the standard library only (pepsi.conf: INPUT =
# message) that splits a message: its payload is CSV text with a header line,
# and it emits one message per data row to stage "row", each with the row as
# its payload and the row's fields, by header, in its state. Emit lines
# ("+{...}") go before the answer; the dispatcher inserts them, with parent_id,
# in the transaction that writes the answer "0 >done", and only then. A
# payload that is not CSV fails its message ("1 reason") and emits nothing.
import base64, csv, io, json, sys

def line(obj):
    return json.dumps(obj, separators=(",", ":"))  # compact, on one line

def split(msg):
    if "payload_base64" in msg:
        text = base64.b64decode(msg["payload_base64"]).decode("utf-8")
    else:
        text = msg.get("payload", "")
    rows = csv.reader(io.StringIO(text, newline=""), strict=True)
    header = next(rows, None)
    out = []
    for row in rows:
        if not row:
            continue  # a blank line
        if len(row) != len(header):
            raise ValueError("line %d has %d fields, the header %d" % (rows.line_num, len(row), len(header)))
        text = io.StringIO()
        # With "\r\n" as the terminator the writer quotes a field holding a
        # line break (with "" it would not: the row would read back as two),
        # and the terminator is taken off again.
        csv.writer(text, lineterminator="\r\n").writerow(row)
        out.append("+" + line({"stage": "row", "payload": text.getvalue()[:-2],
                               "state": {"line": rows.line_num, "fields": dict(zip(header, row))}}))
    return out + ["0 >done " + line({"rows": len(out)})]

for msg in sys.stdin:
    try:
        answer = split(json.loads(msg))
    except (ValueError, csv.Error) as e:  # UnicodeDecodeError is a ValueError
        answer = ["1 not CSV with a header: " + " ".join(str(e).split())]
    for text in answer:
        print(text, flush=True)  # stdout carries emit lines and answers only
