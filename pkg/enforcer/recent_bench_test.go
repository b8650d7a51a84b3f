package enforcer

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// BenchmarkCheckRecent is BenchmarkCheck with the recent-decisions ring off and on (the
// default 1024): what recording every take for Explain costs on the check path.
func BenchmarkCheckRecent(b *testing.B) {
	for _, n := range []struct {
		name string
		size int
	}{{"off", 0}, {"on", 1024}} {
		b.Run(n.name, func(b *testing.B) {
			r := newRig(b, benchRules, func(clock.Clock) bucket.Store { return bucket.NewMemory(clock.Real(), 0) },
				func(c *Config) { c.Clock, c.RecentDecisions = clock.Real(), n.size })
			reqs := benchKeys(1024)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := r.e.Check(ctx, &reqs[i&1023]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRecentAdd is the ring's own cost per recorded take (a check records one per
// enforcing rule taken from).
func BenchmarkRecentAdd(b *testing.B) {
	r := newRecentRing(1024)
	ids := benchKeys(1024)
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.add(ids[i&1023].Attrs.APIKey, "default", true, SourceMemory, now)
	}
}
