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
	now := epoch
	next := int64(1)
	var pending []core.Event
	feed := func(cmds []core.Command) {
		for _, cmd := range cmds {
			switch x := cmd.(type) {
			case core.ResetOrphans:
				pending = append(pending, core.OrphansReset{Op: x.Op})
			case core.Wake:
				pending = append(pending, core.Woken{Op: x.Op})
			case core.Flush:
				pending = append(pending, core.Flushed{Op: x.Op})
			case core.Claim:
				res := core.Claimed{Op: x.Op, Epoch: "e"}
				for _, cp := range x.Caps {
					for range cp.N {
						res.Rows = append(res.Rows, core.Row{ID: next, Stage: cp.Stage})
						next++
					}
				}
				pending = append(pending, res)
			case core.Resolve:
				res := core.Resolved{Op: x.Op, Outcomes: make([]core.Outcome, len(x.Items))}
				for i, it := range x.Items {
					res.Outcomes[i] = core.Outcome{ID: it.ID, Stage: "z", Status: "done"}
				}
				pending = append(pending, res)
			case core.Spawn:
				pending = append(pending, core.WorkerStarted{Worker: x.Worker, PID: int(x.Worker)})
			case core.Stop:
				pending = append(pending, core.WorkerExited{Worker: x.Worker})
			case core.Write:
				for range x.IDs {
					pending = append(pending, core.Answer{Worker: x.Worker, Line: "0"})
				}
			}
		}
	}
	feed(c.Step(now, core.Start{}))
	b.ReportAllocs()
	b.ResetTimer()
	hops := 0
	for hops < b.N {
		evs := pending
		pending = nil
		if len(evs) == 0 {
			b.Fatalf("the core stalled after %d hops", hops)
		}
		for _, ev := range evs {
			if _, ok := ev.(core.Answer); ok {
				hops++
			}
		}
		now = now.Add(100 * time.Microsecond)
		feed(c.Step(now, evs...))
	}
}
