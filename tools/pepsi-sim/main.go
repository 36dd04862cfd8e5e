// Command pepsi-sim runs the deterministic simulator of pepsi-dispatch (package
// sim): the real core against a fake queue and fake workers under injected faults.
//
//	pepsi-sim -seed 42 -v                replay one seed, printing its whole trace
//	pepsi-sim -runs 100000 -workers 2    a campaign over 100000 seeds
//	pepsi-sim -rules                     list the checker's rules
//
// A campaign reports scenarios per second and simulated messages per second, and
// stops at the first failing seed (unless -keep-going), printing the failure and
// the command that replays it. Exit status: 0 when every scenario passed, 1 when
// one failed, 2 for a usage error. It only reads the wall clock to report speed;
// the simulation itself never does.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/sim"
)

func main() {
	cliflags.Main(run)
}

type options struct {
	seed      uint64
	verbose   bool
	runs      int
	start     uint64
	workers   int
	keepGoing bool
	maxTime   time.Duration
	quiet     bool
	rules     bool
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pepsi-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.Uint64Var(&o.seed, "seed", 0, "replay this one seed")
	fs.BoolVar(&o.verbose, "v", false, "with -seed: print the whole trace")
	fs.IntVar(&o.runs, "runs", 0, "run a campaign of this many seeds")
	fs.Uint64Var(&o.start, "start", 0, "first seed of the campaign (0: chosen from the clock and printed)")
	fs.IntVar(&o.workers, "workers", runtime.GOMAXPROCS(0), "scenarios run at once in a campaign")
	fs.BoolVar(&o.keepGoing, "keep-going", false, "count every failing seed instead of stopping at the first")
	fs.DurationVar(&o.maxTime, "max-time", 0, "end the campaign after this long (0: no limit)")
	fs.BoolVar(&o.quiet, "q", false, "print only the summary line (and a failure)")
	fs.BoolVar(&o.rules, "rules", false, "list the rules the checker holds the core to (a failure names the one it broke) and exit")
	if _, err := cliflags.Parse(fs, args, "PEPSI_SIM"); err != nil {
		return cliflags.Fail(stderr, "pepsi-sim", err)
	}
	switch {
	case o.rules:
		for _, r := range sim.Rules() {
			fmt.Fprintf(stdout, "%s (%s)\n\t%s\n", r.Name, r.When, r.Doc)
		}
		return 0
	case o.seed != 0 && o.runs != 0:
		fmt.Fprintln(stderr, "pepsi-sim: give -seed or -runs, not both")
		return 2
	case o.seed != 0:
		return replay(o, stdout)
	case o.runs > 0:
		return campaign(ctx, o, stdout)
	}
	fmt.Fprintln(stderr, "pepsi-sim: give -seed N to replay a seed or -runs N to run a campaign (-h for help)")
	return 2
}

func replay(o options, stdout io.Writer) int {
	opt := sim.Options{}
	if o.verbose {
		opt.Trace = stdout
	}
	res := sim.Run(sim.NewScenario(o.seed), opt)
	if res.Failure != nil {
		fmt.Fprint(stdout, res.Failure.Error())
		return 1
	}
	fmt.Fprintf(stdout, "seed %d passed: %d messages, %d steps, %s simulated, %d lives, trace hash %016x\n",
		o.seed, res.Messages, res.Steps, res.SimTime, res.Lives, res.TraceHash)
	return 0
}

func campaign(ctx context.Context, o options, stdout io.Writer) int {
	if o.start == 0 {
		o.start = uint64(time.Now().UnixNano())&(1<<48-1) | 1
	}
	if o.workers < 1 {
		o.workers = 1
	}
	if !o.quiet {
		fmt.Fprintf(stdout, "campaign: %d seeds from %d, %d workers\n", o.runs, o.start, o.workers)
	}
	began := time.Now()
	var deadline time.Time
	if o.maxTime > 0 {
		deadline = began.Add(o.maxTime)
	}
	var (
		next                        atomic.Int64
		done, msgs, steps, failures atomic.Int64
		simTime                     atomic.Int64
		mu                          sync.Mutex
		first                       *sim.Failure
		stopped                     atomic.Bool
		wg                          sync.WaitGroup
	)
	for range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopped.Load() && ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(o.runs) || (!deadline.IsZero() && time.Now().After(deadline)) {
					return
				}
				seed := o.start + uint64(i)
				res := sim.Run(sim.NewScenario(seed), sim.Options{})
				done.Add(1)
				msgs.Add(int64(res.Messages))
				steps.Add(int64(res.Steps))
				simTime.Add(int64(res.SimTime))
				if res.Failure == nil {
					continue
				}
				failures.Add(1)
				mu.Lock()
				if first == nil || res.Failure.Seed < first.Seed {
					first = res.Failure
				}
				mu.Unlock()
				if o.keepGoing {
					fmt.Fprintf(stdout, "FAIL seed %d: %s\n", seed, res.Failure.Msg)
				} else {
					stopped.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(began).Seconds()
	n := done.Load()
	fmt.Fprintf(stdout, "%d scenarios in %.1fs: %.0f scenarios/s, %.0f simulated messages/s, %.0f core steps/s, %.0fx real time; %d failed\n",
		n, wall, float64(n)/wall, float64(msgs.Load())/wall, float64(steps.Load())/wall,
		time.Duration(simTime.Load()).Seconds()/wall/float64(o.workers), failures.Load())
	if first != nil {
		fmt.Fprint(stdout, first.Error())
		return 1
	}
	if ctx.Err() != nil {
		return 1
	}
	return 0
}
