#!/bin/sh
# A PEPSI stage in POSIX sh (pepsi.conf: INPUT = message) that fans each
# message out to a fixed list of recipients: one emit line per recipient,
# a message at stage "deliver" naming it, then the answer. The dispatcher
# inserts the emitted messages, with parent_id, in the transaction that
# writes "0 >done", and only then. printf writes at once (nothing to flush).
#
# sh cannot read JSON, and the protocol lets a line's keys come in any
# order: this example takes the id from the front of the line, where
# pepsi-dispatch writes it today, and fails a message whose line does not
# begin with it rather than guess. A real stage parses the line (words.py).
while IFS= read -r line; do
	case $line in
	'{"id":'[0-9]*)
		id=${line#'{"id":'}
		id=${id%%[!0-9]*}
		for to in ops@example.org audit@example.org; do
			printf '+{"stage":"deliver","payload":"to: %s","state":{"from":%s}}\n' "$to" "$id"
		done
		printf '0 >done\n' ;;
	*) printf '1 fanout.sh reads the id only from the front of the line\n' ;;
	esac
done
