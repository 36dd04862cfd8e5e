package sim

import (
	"testing"
	"time"
)

// TestASlowPassTakesMostOfItsStagesOwnRuntime holds chooseStageRuntimes to
// what a slow try means at a stage with a MAX_RUNTIME of its own: most of that
// runtime, neither an instant answer nor past the watchdog. Scaling it by
// multiplying two durations overflowed into negative latencies.
func TestASlowPassTakesMostOfItsStagesOwnRuntime(t *testing.T) {
	slow := 0
	for seed := uint64(1); seed <= 3000; seed++ {
		sc := NewScenario(seed)
		for _, m := range sc.messages {
			for j, v := range m.visits {
				own := sc.stages[m.first+j].maxRuntime
				if own == 0 {
					continue
				}
				for _, a := range v.trouble {
					if a.kind != kSlow {
						continue
					}
					slow++
					if a.latency < own/2-time.Millisecond || a.latency >= own {
						t.Fatalf("seed %d: a slow try at a stage whose MAX_RUNTIME is %v takes %v; want at least half of it and under it", seed, own, a.latency)
					}
				}
			}
		}
	}
	if slow == 0 {
		t.Fatal("3000 seeds drew no slow try at a stage with a runtime of its own: the test checks nothing")
	}
}
