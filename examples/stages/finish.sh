#!/bin/sh
# A PEPSI stage in POSIX sh (pepsi.conf: INPUT = message). Each line on stdin
# is one message as JSON; it finishes each one, noting its id in the state.
# echo writes at once (nothing to flush); logs would go to stderr (>&2).
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
		printf '0 >done {"finished":%s}\n' "$id" ;;
	*) printf '1 finish.sh reads the id only from the front of the line\n' ;;
	esac
done
