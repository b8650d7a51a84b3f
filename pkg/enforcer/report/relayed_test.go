package report

import (
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// An answer relayed by a region aggregator counts the enforcer heard as of when the
// leader last confirmed hearing it, or not at all before it has; the leader's own answer
// as of its arrival.
func TestHeardAtRelayed(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	for _, c := range []struct {
		resp *allotv1.ReportResponse
		want time.Time
		ok   bool
	}{
		{&allotv1.ReportResponse{Accepted: true}, at, true},
		{&allotv1.ReportResponse{Accepted: true, Relayed: true, HeardAgoMs: 12_000}, at.Add(-12 * time.Second), true},
		{&allotv1.ReportResponse{Accepted: true, Relayed: true, HeardAgoMs: -1}, time.Time{}, false},
	} {
		got, ok := heardAt(at, c.resp)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("heardAt(%v) = %v, %v; want %v, %v", c.resp, got, ok, c.want, c.ok)
		}
	}
}
