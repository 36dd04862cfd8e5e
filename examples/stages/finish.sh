#!/bin/sh
# A PEPSI stage in POSIX sh (pepsi.conf: INPUT = message). Each line on stdin
# is one message as JSON; it finishes each one, noting its id in the state.
# echo writes at once (nothing to flush); logs would go to stderr (>&2).
while IFS= read -r line; do
	id=${line#'{"id":'}
	id=${id%%,*}
	printf '0 >done {"finished":%s}\n' "$id"
done
