// Package worker starts, feeds, reads, stops and kills stage programs (the worker
// processes of pepsi-dispatch) and turns what happens to them into core events:
// WorkerStarted or SpawnFailed, one Answer per line of standard output, and exactly
// one WorkerExited after the last Answer. It executes the core's Spawn, Write, Stop
// and Kill commands and nothing else.
//
// It must never take a decision: it does not parse answers, count ids, time
// anything out or retry a spawn. Those belong to the pure core, which sees every
// fact this package observes as an event and nothing through a side channel.
//
// The worker protocol (docs/protocol.md): a worker is started as
// "PROGRAM worker [-c CONFIG_FILE]" with PEPSI_STAGE=<stage> added to the
// environment, reads one decimal id per line on standard input, answers one line
// per id on standard output, and has its standard error logged line by line.
//
// The package is Linux only (files named *_linux.go): a worker must die with the
// dispatcher, and the parent-death signal that guarantees it is a Linux feature.
// See Pool for how that guarantee survives Go's thread scheduling.
package worker
