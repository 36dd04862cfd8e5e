package core_test

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// BenchmarkHop measures the core alone for one message hop: its claim result,
// the write to a worker, the worker's answer, and the requeue (resolve) result.
// Events arrive in batches, as the shell delivers them under load. One op = one hop.
func BenchmarkHop(b *testing.B) {
	cfg, err := conf.Parse("bench.conf", "[stage-a]\nPROGRAM = a\nPARALLELISM = 4\nQUEUE_LIMIT = 4\n[stage-b]\nPROGRAM = b\nPARALLELISM = 4\nQUEUE_LIMIT = 4\n")
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
		now = now.Add(time.Microsecond)
		feed(c.Step(now, evs...))
	}
}
