#!/bin/sh
# audit.sh: the last stage of the demo pipeline (audit -> done), written in plain
# sh with psql to show that a PEPSI stage needs no Go and no library, only the
# worker protocol of SPEC.md:
#
#   started as "audit.sh worker [-c FILE]" with PEPSI_STAGE set; reads one
#   message id per line on standard input; for each, makes one guarded
#   transition and answers one line on standard output: "0" for success,
#   "N reason" (N non-zero) for a failure; errors go to standard error; at the
#   end of input it finishes and exits 0.
#
# One psql runs for the whole life of the worker (a coprocess fed through two
# FIFOs), so each message costs one statement, not one connection. The UPDATE is
# guarded by status = 'running' AND stage = PEPSI_STAGE, so a row that is not
# ours is left alone (and still answered 0: the dispatcher sees the row as it is).
# If psql dies (the connection was lost), the script exits without answering:
# the dispatcher handles that like any crashed worker.
set -eu

usage() { echo "usage: $0 worker [-c FILE]" >&2; exit 2; }
[ "${1:-}" = worker ] || usage
shift
conf=
case $# in
0) ;;
2) [ "$1" = -c ] || usage; conf=$2 ;;
*) usage ;;
esac

stage=${PEPSI_STAGE:-}
case $stage in
'') echo "audit.sh: PEPSI_STAGE is not set (pepsi-dispatch sets it)" >&2; exit 2 ;;
*[!A-Za-z0-9_-]*) echo "audit.sh: PEPSI_STAGE=$stage is not a stage name" >&2; exit 2 ;;
esac

# The database: PEPSI_DATABASE, else [pepsi] DATABASE of the -c file, else the
# libpq PG* environment.
if [ -n "${PEPSI_DATABASE+set}" ]; then
	db=$PEPSI_DATABASE
elif [ -n "$conf" ]; then
	[ -r "$conf" ] || { echo "audit.sh: cannot read $conf" >&2; exit 2; }
	db=$(awk '
		/^[ \t]*[#;]/ { next }
		/^[ \t]*\[/ { s = $0; gsub(/[ \t\[\]]/, "", s); section = s; next }
		section == "pepsi" && /^[ \t]*DATABASE[ \t]*=/ {
			v = $0; sub(/^[^=]*=[ \t]*/, "", v); sub(/[ \t\r]+$/, "", v); print v; exit
		}' "$conf")
else
	db=
fi
if [ -n "$db" ]; then set -- -d "$db"; else set --; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkfifo "$tmp/sql" "$tmp/out"
PGAPPNAME="pepsi-stage $stage" psql -X -q -A -t -v ON_ERROR_STOP=0 -v VERBOSITY=terse "$@" <"$tmp/sql" >"$tmp/out" &
exec 3>"$tmp/sql" 4<"$tmp/out"
# The dispatcher's synchronous commit after each answer is the durability point
# (see the stage package's documentation), so the stage's own commit need not wait.
echo "SET synchronous_commit = off;" >&3

while IFS= read -r id || [ -n "$id" ]; do
	case $id in
	'') continue ;;
	*[!0-9]*) echo "1 not a message id: $id"; continue ;;
	esac
	cat >&3 <<SQL
UPDATE pepsi.queue
SET status = 'done', state = state || jsonb_build_object('audited_at', now()), updated_at = now()
WHERE ingress_id = $id AND status = 'running' AND stage = '$stage';
\if :ERROR
\echo pepsi-audit-failed :LAST_ERROR_MESSAGE
\else
\echo pepsi-audit-ok
\endif
SQL
	answer=
	while IFS= read -r line <&4; do
		case $line in
		pepsi-audit-ok) answer=0; break ;;
		pepsi-audit-failed*) answer="1 audit: ${line#pepsi-audit-failed }"; break ;;
		esac
	done
	if [ -z "$answer" ]; then
		echo "audit.sh: psql ended while message $id was in hand; exiting" >&2
		exit 1
	fi
	echo "$answer"
done

exec 3>&-
wait
