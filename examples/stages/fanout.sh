#!/bin/sh
# A PEPSI stage in POSIX sh (pepsi.conf: INPUT = message) that fans each
# message out to a fixed list of recipients: one emit line per recipient,
# a message at stage "deliver" naming it, then the answer. The dispatcher
# inserts the emitted messages, with parent_id, in the transaction that
# writes "0 >done", and only then. printf writes at once (nothing to flush).
while IFS= read -r line; do
	id=${line#'{"id":'}
	id=${id%%,*}
	for to in ops@example.org audit@example.org; do
		printf '+{"stage":"deliver","payload":"to: %s","state":{"from":%s}}\n' "$to" "$id"
	done
	printf '0 >done\n'
done
