#!/bin/sh
# audit.sh: the last stage of the demo pipeline (audit -> done), written in plain
# POSIX sh to show that a PEPSI stage needs no Go, no library and here not even
# a database connection, only the worker protocol (README.md, "Writing a stage
# in any other language"):
#
#   started as "audit.sh worker [-c FILE]" with PEPSI_STAGE set; reads one
#   message id per line on standard input; answers one line per id on standard
#   output, in order; errors go to standard error; at the end of input it exits 0.
#
# It never touches the database: it needs nothing from the row, so each answer
# carries the whole transition and the dispatcher writes it, guarded, in its own
# batched transaction:
#
#   0 >done {"audited_by":"audit.sh"}
#
# finishes the message and merges that key into its state (state || patch). A
# row that is no longer running at this stage is the dispatcher's to notice (its
# guard writes nothing). The patch records who audited the message, not when:
# the row's updated_at says when, and a clock in sh costs a fork per message.
set -eu

usage() { echo "usage: $0 worker [-c FILE]" >&2; exit 2; }
[ "${1:-}" = worker ] || usage
shift
case $# in
0) ;;
2) [ "$1" = -c ] || usage ;; # the configuration holds nothing this stage needs
*) usage ;;
esac

stage=${PEPSI_STAGE:-}
case $stage in
'') echo "audit.sh: PEPSI_STAGE is not set (pepsi-dispatch sets it)" >&2; exit 2 ;;
*[!A-Za-z0-9_-]*) echo "audit.sh: PEPSI_STAGE=$stage is not a stage name" >&2; exit 2 ;;
esac

# Each printf is one write(2), so every answer reaches the dispatcher at once.
while IFS= read -r id || [ -n "$id" ]; do
	case $id in
	'') continue ;;
	*[!0-9]*) printf '1 not a message id: %s\n' "$id"; continue ;;
	esac
	printf '%s\n' '0 >done {"audited_by":"audit.sh"}'
done
