package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/balancer/admin"
)

// The shares command prints what each region's bucket refuses and, where a region's cut
// of the burst is short, the burst that would serve it.
func TestPrintSharesNamesAShortBurst(t *testing.T) {
	var out bytes.Buffer
	printShares(&out, admin.SharesResponse{Identity: "key:k1", Source: "core", Regions: []string{"us-east", "eu-west"},
		Entries: []admin.SharesEntry{{Rule: "default", Shares: map[string]float64{"us-east": 0.5, "eu-west": 0.5},
			Demand:      map[string]float64{"us-east": 1, "eu-west": 1},
			Refused:     map[string]float64{"us-east": 0.0963, "eu-west": 0.0963},
			BurstAdvice: &balancer.BurstAdvice{Limit: "default/second", Now: 4, Burst: 9}}}})
	for _, want := range []string{"REFUSED", "9.6%", "default: the burst of default/second (4), cut between the regions, refuses over 3% more of a region's demand under its rate than one bucket of the limit would; a burst of 9 would serve every region"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in:\n%s", want, out.String())
		}
	}
}
