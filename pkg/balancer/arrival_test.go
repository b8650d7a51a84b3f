package balancer

import (
	"math"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// The arrival tests (arrival.go) on their own: one report, the region's reports
// together, an aggregator's merge.

// A move is judged by the Poisson count behind a recent rate (IdentityUsage.recent_tokens):
// a 50/s key's region holding 15/s over three enforcers, its traffic swapped to 60/s, is
// read at about 20/s an enforcer in the first report after — a shift; the rate alone
// (an older enforcer) needs it doubled and 10/s an enforcer beyond the noise; a sparse
// pair's first requests, or a steady rate's noise, are not.
func TestArrivalJudgedByItsCount(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) {
		c.Limits = func(string, string) (Limits, bool) { return Limits{Rate: 50}, true }
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.newIdent("default", "key:a")
	if !ok {
		t.Fatal("no identity")
	}
	id.st.Smoothed = []float64{60, 15, 0}
	copy(id.published(c.n), []float64{0.69, 0.30, 0.01})
	for _, tc := range []struct {
		name          string
		rate, tokens  float64
		reports, enfs int
		want          bool
	}{
		{"a swap, counted over 0.9 s", 20, 18, 1, 3, true},
		{"the same rate without a count", 20, 0, 1, 3, false},
		{"doubled and more without a count", 37, 0, 1, 3, true},
		{"a steady rate's 3σ-high second", 8, 7.2, 1, 3, false},
	} {
		if got := c.shifted(id, 1, tc.rate, tc.tokens, true, false, tc.reports, tc.enfs, tc.enfs); got != tc.want {
			t.Errorf("%s: shifted %v, want %v", tc.name, got, tc.want)
		}
	}
	// A count the region was not refused for is no arrival, however high: over 10,000
	// keys and a report every few hundred milliseconds a 1e-5 test still fired a few
	// times an interval, each a recompute and a version.
	if c.shifted(id, 1, 20, 18, false, false, 1, 3, 3) {
		t.Error("a count with nothing refused read as an arrival")
	}
	// Traffic that rose within its region's share is not refused: no move needed.
	roomy, _ := c.newIdent("default", "key:roomy")
	roomy.st.Smoothed = []float64{0, 10, 0}
	copy(roomy.published(c.n), []float64{0.05, 0.9, 0.05})
	if c.shifted(roomy, 1, 40, 36, true, false, 1, 1, 1) {
		t.Error("a rise to 40/s within a share of 45/s read as an arrival")
	}
	// A sparse key (3/s, never seen in the region): two requests in the half second
	// after its pair appeared read 4/s; eight do move it.
	sparse, _ := c.newIdent("default", "key:sparse")
	sparse.rate = 3
	if c.shifted(sparse, 1, 4, 2, true, false, 1, 3, 3) {
		t.Error("a sparse pair's first two requests read as an arrival")
	}
	if !c.shifted(sparse, 1, 16, 8, true, false, 1, 3, 3) {
		t.Error("eight requests in half a second where one was due: not an arrival")
	}
	// A rare key's clump (issue 26): 0.85/s in a region of three enforcers (smoothed
	// 0.66/s), five requests in half a second at one of them, the last three refused —
	// about once in 10 s somewhere among 10,000 keys' streams, each read as an arrival of
	// 30/s, a shift and three versions. Under one token due, the count is judged against
	// one: eight requests are an arrival, five are not.
	rare, _ := c.newIdent("default", "key:rare")
	rare.rate = 7
	rare.st.Smoothed = []float64{0, 0.66, 0}
	copy(rare.published(c.n), []float64{0.33, 0.33, 0.34})
	if c.shifted(rare, 1, 9.86, 5, true, false, 1, 3, 3) {
		t.Error("a rare key's clump of five requests read as an arrival")
	}
	if !c.shifted(rare, 1, 16, 8, true, false, 1, 3, 3) {
		t.Error("eight requests in half a second of a rare key: not an arrival")
	}
	// Nothing a report claims widens the test past what an enforcer measures: a count
	// far above its rate (a span of minutes) is read over one second at most.
	if c.shifted(id, 1, 6, 600, true, false, 1, 3, 3) {
		t.Error("a forged span widened the arrival test")
	}
}

// The arrival test on a region's reports together (arrivedTogether): a 50/s key whose
// 15/s in a three-enforcer region became 60/s, counted 13, 10 and 14 tokens by three
// reports within 0.7 s (seen in many-keys, seed 32) — each under its own threshold, the
// three over theirs. Two reports of one enforcer are never summed (their spans overlap),
// nor reports further apart than arrivalSpan, nor an aggregator's merge, nor a small
// key's few tokens.
func TestArrivalJudgedOnTheRegionsReports(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) {
		c.Limits = func(string, string) (Limits, bool) { return Limits{Rate: 50}, true }
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	fresh := func(name string, smoothed float64) *ident {
		id, ok := c.newIdent("default", name)
		if !ok {
			t.Fatal("no identity")
		}
		id.st.Smoothed = []float64{60, smoothed, 0}
		copy(id.published(c.n), []float64{0.69, 0.30, 0.01})
		return id
	}
	at := func(ms int) time.Time { return time.UnixMilli(int64(1e6 + ms)) }
	a, b, e := enforcerBit("eu-west-0"), enforcerBit("eu-west-1"), enforcerBit("eu-west-2")
	if a == b || b == e || a == e {
		t.Fatal("the three enforcers' bits collide: pick other names")
	}
	type report struct {
		bit          uint64
		ms           int
		rate, tokens float64
	}
	sum := func(id *ident, rs []report) (got []bool) {
		for _, r := range rs {
			_, ok := c.arrivedTogether(at(r.ms), id, 1, r.bit, r.rate, r.tokens, true, 3)
			got = append(got, ok)
		}
		return got
	}
	three := []report{{e, 0, 15.2, 13}, {a, 540, 11.2, 10}, {b, 650, 18.7, 14}}
	alone := fresh("key:alone", 14.3)
	for _, r := range three {
		if c.shifted(alone, 1, r.rate, r.tokens, true, false, 1, 3, 3) {
			t.Fatalf("the report of %.0f tokens passed alone; the case is meant to need the sum", r.tokens)
		}
	}
	if got := sum(fresh("key:a", 14.3), three); got[0] || got[1] || !got[2] {
		t.Errorf("13, 10 and 14 tokens from three enforcers where about 12 were due: arrived %v, want only at the third", got)
	}
	twice := []report{{e, 0, 15.2, 13}, {a, 540, 11.2, 10}, {e, 650, 18.7, 14}}
	if got := sum(fresh("key:b", 14.3), twice); got[2] {
		t.Error("eu-west-2's second report summed with its first")
	}
	if got := sum(fresh("key:c", 14.3), []report{{a, 0, 18, 15}, {a, 300, 18, 15}, {a, 600, 18, 15}}); got[1] || got[2] {
		t.Error("one enforcer's reports summed")
	}
	if got := sum(fresh("key:d", 14.3), []report{{e, 0, 15.2, 13}, {a, 500, 11.2, 10}, {b, 600, 15, 12}}); !got[2] {
		t.Error("13, 10 and 12 tokens within 0.6 s: not an arrival")
	}
	if got := sum(fresh("key:g", 14.3), []report{{e, 0, 15.2, 13}, {a, 2500, 11.2, 10}, {b, 2600, 15, 12}}); got[2] {
		t.Error("a report 2.5 s before the others summed with them")
	}
	if got := sum(fresh("key:e", 14.3), []report{{0, 0, 18, 15}, {0, 100, 18, 15}, {0, 200, 18, 15}}); got[1] || got[2] {
		t.Error("an aggregator's merged reports summed again")
	}
	// A small key (1.5/s in the region): its recent counts are a token or two, biased
	// high; three reports of 4 tokens where 1.5 were due stay with the one-report test.
	if got := sum(fresh("key:small", 1.5), []report{{e, 0, 4, 4}, {a, 300, 4, 4}, {b, 600, 4, 4}}); got[2] {
		t.Error("a small key's three reports summed: want the one-report test")
	}
	// Nothing refused: no state is kept for an identity that never was.
	quiet := fresh("key:f", 14.3)
	c.arrivedTogether(at(0), quiet, 1, a, 18, 15, false, 3)
	if quiet.arr != nil {
		t.Error("an identity refused nothing keeps arrival sums")
	}
}

// An aggregator's merge of several reports is tested as the leader tests several
// enforcers' reports together (mergeShifted, arrivedTogether), not as one report. Tested
// as one, a small key's few clumped tokens at three enforcers passed where none of the
// reports would have (through aggregators the 10,000-key population published four times
// as many versions).
func TestMergeTestedAsItsReports(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) {
		c.Limits = func(string, string) (Limits, bool) { return Limits{Rate: 50}, true }
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	fresh := func(name string, smoothed ...float64) *ident {
		id, ok := c.newIdent("default", name)
		if !ok {
			t.Fatal("no identity")
		}
		id.st.Smoothed = smoothed
		copy(id.published(c.n), []float64{0.69, 0.30, 0.01})
		return id
	}
	small := func(name string) *ident { // a key of 3/s, 1.5/s of it in the region
		id := fresh(name, 0, 1.5, 0)
		id.rate = 3
		return id
	}
	merged := func(rate, tokens, refused float64, draining bool) *allotv1.IdentityUsage {
		return &allotv1.IdentityUsage{Rule: "default", RecentRate: rate, RecentTokens: tokens, Refused: refused, Draining: draining}
	}
	for _, tc := range []struct {
		name    string
		id      *ident
		u       *allotv1.IdentityUsage
		reports int
		want    bool
	}{
		// TestArrivalJudgedOnTheRegionsReports' three reports (13, 10 and 14 tokens, each
		// under its own threshold) merged: the sum passes, as it does directly.
		{"three reports over their sum's threshold", fresh("key:sum", 60, 14.3, 0), merged(45.1, 37, 3, false), 3, true},
		{"two reports counting 36 where 9 were due", fresh("key:two", 60, 15, 0), merged(40, 36, 1, false), 2, true},
		{"three reports short of a token a report past the first", fresh("key:short", 60, 14.3, 0), merged(36, 29.5, 3, false), 3, false},
		{"the same sum, nothing refused", fresh("key:quiet", 60, 14.3, 0), merged(45.1, 37, 0, false), 3, false},
		// Draining is one report's evidence: a merge does not say whose count it was.
		{"the same sum, draining", fresh("key:drain", 20, 14.3, 0), merged(45.1, 37, 0, true), 3, false},
		// A small key (3/s, 1.5/s in the region): three reports of 4 tokens, one refused.
		// Read as one report, 12 tokens where 1.5 were due passed; directly none of the
		// three does, and their sum is a small key's, which keeps the one-report test.
		{"a small key's clumps at three enforcers", small("key:small"), merged(12, 12, 1, false), 3, false},
	} {
		rate, got := c.mergeShifted(tc.id, 1, tc.u, tc.reports, 3)
		if got != tc.want || math.Abs(rate-tc.u.RecentRate/float64(tc.reports)) > 1e-9 {
			t.Errorf("%s: moved %v at %.2f/s an enforcer, want %v at the merge's mean", tc.name, got, rate, tc.want)
		}
	}
	// Left is read from the sum, as for any report.
	if _, got := c.mergeShifted(fresh("key:left", 0, 400, 0), 1, merged(3, 3, 0, false), 3, 3); !got {
		t.Error("400/s offered in a region falling to 3/s over three merged reports: not read as left")
	}
}

// Through Ingest: a merge of three members' reports is routed to the merge's test.
func TestMergeIngestedAsItsReports(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) {
		c.Limits = func(string, string) (Limits, bool) { return Limits{Rate: 50}, true }
	})
	now := t0
	members := []aggMember{{"e1", 0, 0, 1}, {"e2", 0, 0, 1}, {"e3", 0, 0, 1}}
	forward := func(seq uint64, u *allotv1.IdentityUsage) *allotv1.ReportRequest {
		r := aggReport("eu-west", seq, now, members, u)
		for _, m := range r.Members {
			m.RecentReports = 1
		}
		return r
	}
	if err := c.Ingest(now, forward(1, &allotv1.IdentityUsage{Rule: "default", Identity: "key:small", Admitted: 10})); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	id := c.ids[key{"default", "key:small"}]
	id.st.Smoothed, id.rate = []float64{0, 1.5, 0}, 3 // a key of 3/s, 1.5/s of it in eu-west
	copy(id.published(c.n), []float64{0.33, 0.33, 0.34})
	c.shiftPending, id.shift = false, false
	c.mu.Unlock()
	clumps := &allotv1.IdentityUsage{Rule: "default", Identity: "key:small", Admitted: 11, Refused: 1, RecentRate: 12, RecentTokens: 12}
	if err := c.Ingest(now, forward(2, clumps)); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.shiftPending {
		t.Error("three members' clumps of a small key, merged, read as an arrival")
	}
}
