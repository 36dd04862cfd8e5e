package core_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// BenchmarkHop measures the core alone for one message hop: its claim result,
// the write to a worker, the worker's answer, and the requeue (resolve) result.
// Events arrive in batches, as the shell delivers them under load, 100 µs
// apart. One op = one hop. rated is the same with a RATE on both stages far
// above the hops the core makes per second of its clock (at most 320,000 here),
// so it never holds them back: the difference is what the rate's bookkeeping
// costs (docs/performance.md, "RATE").
func BenchmarkHop(b *testing.B) {
	const stages = "[stage-a]\nPROGRAM = a\nPARALLELISM = 4\nQUEUE_LIMIT = 4\n[stage-b]\nPROGRAM = b\nPARALLELISM = 4\nQUEUE_LIMIT = 4\n"
	b.Run("plain", func(b *testing.B) { benchmarkHop(b, stages) })
	b.Run("rated", func(b *testing.B) {
		benchmarkHop(b, strings.ReplaceAll(stages, "QUEUE_LIMIT = 4\n", "QUEUE_LIMIT = 4\nRATE = 1000000\n"))
	})
}

func benchmarkHop(b *testing.B, text string) {
	cfg, err := conf.Parse("bench.conf", text)
	if err != nil {
		b.Fatal(err)
	}
	c := core.New(cfg)
	w := &benchWorld{now: epoch, next: 1}
	w.feed(c.Step(w.now, core.Start{}))
	b.ReportAllocs()
	b.ResetTimer()
	hops, idle := 0, 0
	for hops < b.N {
		evs := w.pending
		w.pending = nil
		if len(evs) == 0 {
			// Nothing is in flight: the core waits for its timer (a worker
			// recycled, a claim paced), as the shell would, which then ticks.
			if w.timer.IsZero() || idle > 100 {
				b.Fatalf("the core stalled after %d hops", hops)
			}
			idle++
			w.now, w.timer = w.timer, time.Time{}
			evs = []core.Event{core.Tick{}}
		}
		for _, ev := range evs {
			if _, ok := ev.(core.Answer); ok {
				hops++
				idle = 0
			}
		}
		w.now = w.now.Add(100 * time.Microsecond)
		w.feed(c.Step(w.now, evs...))
	}
}

// benchWorld answers every command the core gives, at once and successfully,
// as a queue with an endless backlog and workers that answer "0" would. A
// command left unanswered would stall the core the moment it waits on it (the
// timer of a recycled worker's replacement, the queue's health).
type benchWorld struct {
	now     time.Time
	timer   time.Time
	next    int64
	pending []core.Event
}

func (w *benchWorld) feed(cmds []core.Command) {
	for _, cmd := range cmds {
		switch x := cmd.(type) {
		case core.ResetOrphans:
			w.pending = append(w.pending, core.OrphansReset{Op: x.Op})
		case core.Wake:
			w.pending = append(w.pending, core.Woken{Op: x.Op})
		case core.Flush:
			w.pending = append(w.pending, core.Flushed{Op: x.Op})
		case core.KeepHistory:
			w.pending = append(w.pending, core.HistoryKept{Op: x.Op, Through: x.Through})
		case core.Claim:
			res := core.Claimed{Op: x.Op, Epoch: "e"}
			for _, cp := range x.Caps {
				for range cp.N {
					res.Rows = append(res.Rows, core.Row{ID: w.next, Stage: cp.Stage})
					w.next++
				}
			}
			w.pending = append(w.pending, res)
		case core.Resolve:
			res := core.Resolved{Op: x.Op, Outcomes: make([]core.Outcome, len(x.Items))}
			for i, it := range x.Items {
				res.Outcomes[i] = core.Outcome{ID: it.ID, Stage: "z", Status: "done"}
			}
			w.pending = append(w.pending, res)
		case core.Inspect:
			w.pending = append(w.pending, core.Inspected{Op: x.Op, Autovacuum: true})
		case core.Vacuum:
			w.pending = append(w.pending, core.Vacuumed{Op: x.Op})
		case core.Rest:
			w.pending = append(w.pending, core.Resting{})
		case core.Spawn:
			w.pending = append(w.pending, core.WorkerStarted{Worker: x.Worker, PID: int(x.Worker)})
		case core.Stop:
			w.pending = append(w.pending, core.WorkerExited{Worker: x.Worker})
		case core.Kill:
			w.pending = append(w.pending, core.WorkerExited{Worker: x.Worker, Signal: "killed"})
		case core.Write:
			for range x.IDs {
				w.pending = append(w.pending, core.Answer{Worker: x.Worker, Line: "0"})
			}
		case core.SetTimer:
			w.timer = x.At
		}
	}
}
