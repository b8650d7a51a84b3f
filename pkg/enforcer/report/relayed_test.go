package report

import (
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// An answer relayed by a region aggregator counts the enforcer heard as of when the
// leader last confirmed hearing it, or not at all before it has; the leader's own answer
// as of its arrival. The report heard is the one the leader confirmed (heard_seq), the
// one taken this report (an enforcer cut off alone marks itself with it).
func TestHeardAtRelayed(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	for _, c := range []struct {
		resp *allotv1.ReportResponse
		want time.Time
		ok   bool
	}{
		{&allotv1.ReportResponse{Accepted: true, ShareLeaderRev: 3, ShareVersion: 40}, at, true},
		{&allotv1.ReportResponse{Accepted: true, Relayed: true, HeardAgoMs: 12_000, HeardSeq: 8, ShareLeaderRev: 3, ShareVersion: 39}, at.Add(-12 * time.Second), true},
		{&allotv1.ReportResponse{Accepted: true, Relayed: true, HeardAgoMs: -1}, time.Time{}, false},
		{&allotv1.ReportResponse{Accepted: true, Relayed: true, HeardAgoMs: 5_000}, at.Add(-5 * time.Second), true}, // an older aggregator: no heard_seq
	} {
		got, ok := heardAt(at, c.resp)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("heardAt(%v) = %v, %v; want %v, %v", c.resp, got, ok, c.want, c.ok)
		}
		a, ok := AcceptanceOf(at, 9, c.resp)
		seq := uint64(9)
		if c.resp.Relayed && c.resp.HeardSeq != 0 {
			seq = c.resp.HeardSeq
		}
		if ok != c.ok || ok && (!a.At.Equal(c.want) || a.Seq != seq || a.LeaderRev != c.resp.ShareLeaderRev || a.Version != c.resp.ShareVersion) {
			t.Errorf("AcceptanceOf(%v) = %+v, %v; want at %v, seq %d, the answer's set", c.resp, a, ok, c.want, seq)
		}
	}
}
