package e2e

import (
	"strings"
	"testing"
)

// TestLoadTablePairedRatios: the table's per-round ratios are those of checks/s, server
// CPU and p99, whatever figures are added to it (they are picked by name).
func TestLoadTablePairedRatios(t *testing.T) {
	r := &loadReport{Rounds: 1, Rows: []*loadRow{
		{Target: "null", Round: 1, ChecksPerSec: 100, ServerUsPerCheck: 10, P99ms: 2, OpenRate: 50},
		{Target: "allot", Round: 1, ChecksPerSec: 80, ServerUsPerCheck: 13, P99ms: 2.5, OpenRate: 50},
	}}
	out := r.table()
	for _, want := range []string{
		"| checks/s, closed loop C=64, allot / null per round | 0.80× | — | median 0.80× |",
		"| server CPU µs/check, allot / null per round | 1.30× | — | median 1.30× |",
		"| p99 ms, open loop, allot / null per round | 1.25× | — | median 1.25× |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}
