package aggregator

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

var t0 = time.UnixMilli(1_700_000_000_000)

func rep(id string, seq uint64, ver uint64, usage ...*allotv1.IdentityUsage) *allotv1.ReportRequest {
	return &allotv1.ReportRequest{Region: "us-east", EnforcerId: id, Seq: seq, ShareLeaderRev: 7, ShareVersion: ver,
		IntervalStartMs: t0.UnixMilli(), IntervalEndMs: t0.Add(10 * time.Second).UnixMilli(), RecentWindowMs: 1000, Usage: usage}
}

func use(identity string, admitted, refused, errb, recent float64) *allotv1.IdentityUsage {
	return &allotv1.IdentityUsage{Rule: "r", Identity: identity, Admitted: admitted, Refused: refused, Error: errb,
		RecentRate: recent, RecentTokens: recent, RegionalRate: 50}
}

func byID(req *allotv1.ReportRequest) map[string]*allotv1.IdentityUsage {
	out := map[string]*allotv1.IdentityUsage{}
	for _, u := range req.Usage {
		out[u.Identity] = u
	}
	return out
}

// The merge sums counts and error bounds (a merged Space-Saving summary's error is at
// most the sum of its parts'): the truth of each part lies in [count, count + error], so
// the merge's lies in [Σ count, Σ count + Σ error].
func TestMergeKeepsErrorBound(t *testing.T) {
	g := newMerger("us-east", 100, 100, 100, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	draining := use("k1", 200, 0, 8, 20)
	draining.Draining = true // one enforcer saw the region's bucket under half
	for _, r := range []*allotv1.ReportRequest{
		rep("e1", 1, 3, use("k1", 100, 10, 5, 12), use("k2", 7, 0, 2, 1)),
		rep("e2", 1, 3, draining),
		rep("e3", 1, 3, use("k2", 3, 1, 0, 0.5)),
	} {
		if _, dup, _, err := g.add(now, r); err != nil || dup {
			t.Fatalf("add: dup %v err %v", dup, err)
		}
	}
	req := g.flush(now, time.Hour)
	u := byID(req)
	if k1 := u["k1"]; k1.Admitted != 300 || k1.Refused != 10 || k1.Error != 13 || k1.RecentRate != 32 || k1.RecentTokens != 32 || k1.RegionalRate != 50 {
		t.Errorf("k1 = %v, want admitted 300 refused 10 error 13 recent 32 (32 tokens) regional 50", k1)
	}
	if !u["k1"].Draining || u["k2"].Draining {
		t.Errorf("draining k1 %v k2 %v, want true (one member's) false", u["k1"].Draining, u["k2"].Draining)
	}
	if k2 := u["k2"]; k2.Admitted != 10 || k2.Refused != 1 || k2.Error != 2 || math.Abs(k2.RecentRate-1.5) > 1e-9 {
		t.Errorf("k2 = %v, want admitted 10 refused 1 error 2 recent 1.5", k2)
	}
	if len(req.Members) != 3 {
		t.Fatalf("members %v, want e1 e2 e3", req.Members)
	}
	for _, m := range req.Members {
		if m.Reports != 1 || m.RecentReports != 1 || m.CoveredMs != 10_000 || m.ShareVersion != 3 || m.ShareLeaderRev != 7 || m.HeardAgoMs != 0 {
			t.Errorf("member %v: want one report covering 10s, version 7/3, heard 0 ms ago", m)
		}
	}
	// The next flush lists the members again (how long ago each was heard), with no usage.
	later := g.flush(now.Add(3*time.Second), time.Hour)
	if len(later.Usage) != 0 || len(later.Members) != 3 || later.Members[0].HeardAgoMs != 3000 || later.Members[0].Reports != 0 {
		t.Errorf("second flush = %v, want three members heard 3000 ms ago, no reports, no usage", later)
	}
}

// A retry (same enforcer and seq) is merged once.
func TestMergeRetryOnce(t *testing.T) {
	g := newMerger("us-east", 100, 100, 100, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	for i := 0; i < 3; i++ {
		_, dup, _, err := g.add(now, rep("e1", 5, 1, use("k", 10, 0, 0, 0)))
		if err != nil || dup != (i > 0) {
			t.Fatalf("try %d: dup %v err %v", i, dup, err)
		}
	}
	if got := byID(g.flush(now, time.Hour))["k"].Admitted; got != 10 {
		t.Errorf("admitted %v after a report and two retries, want 10", got)
	}
}

// A client inventing keys never grows the table past 2 × MaxEntries; what it drops is
// counted, and a forward carries the MaxEntries most refused, then busiest. (A new key
// past the table's bound is omitted, as the leader omits new identities past its own.)
func TestMergeBounded(t *testing.T) {
	const max = 4
	g := newMerger("us-east", max, 2, 3, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	seq := uint64(1)
	if _, _, _, err := g.add(now, rep("e1", seq, 1, use("hot", 1, 500, 0, 0))); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		var us []*allotv1.IdentityUsage
		for j := 0; j < max; j++ {
			us = append(us, use(string(rune('a'+i*max+j)), float64(1+i*max+j), 0, 0, 0))
		}
		seq++
		if _, _, _, err := g.add(now, rep("e1", seq, 1, us...)); err != nil {
			t.Fatal(err)
		}
		if len(g.usage) > 2*max {
			t.Fatalf("table holds %d identities, more than 2 × %d", len(g.usage), max)
		}
	}
	req := g.flush(now, time.Hour)
	if len(req.Usage) != max || req.Usage[0].Identity != "hot" {
		t.Errorf("forward carries %d entries, first %q; want %d, the refused one first", len(req.Usage), req.Usage[0].Identity, max)
	}
	var kept, all float64
	for _, u := range req.Usage {
		kept += u.Admitted + u.Refused
	}
	for i := 1; i <= 5*max; i++ {
		all += float64(i)
	}
	all += 501
	if req.OmittedIdentities != 5*max+1-max || math.Abs(kept+req.OmittedTokens-all) > 1e-9 {
		t.Errorf("omitted %d identities, %v tokens (kept %v): every token must be in an entry or omitted (%v)", req.OmittedIdentities, req.OmittedTokens, kept, all)
	}
	// Members are capped too.
	for i, id := range []string{"e2", "e3"} {
		if _, _, _, err := g.add(now, rep(id, uint64(i+1), 1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, err := g.add(now, rep("e4", 1, 1)); !errors.Is(err, ErrTooManyMembers) {
		t.Errorf("a fourth enforcer past MaxMembers 3: err %v, want ErrTooManyMembers", err)
	}
}

// The same reports make the same forward, entry for entry, whatever the order of the
// merge's maps (regionsim's runs through aggregators repeat exactly): pressured first, then
// the busiest, then by name; quotas by name.
func TestMergeForwardsInOrder(t *testing.T) {
	forward := func() *allotv1.ReportRequest {
		g := newMerger("us-east", 100, 100, 100, 10*time.Second, t0)
		now := t0.Add(10 * time.Second)
		var us []*allotv1.IdentityUsage
		var qs []*allotv1.QuotaCount
		for i := range 40 {
			us = append(us, use(fmt.Sprintf("k%02d", i), float64(i%4), float64(i%3), 0, 0))
			qs = append(qs, &allotv1.QuotaCount{Rule: "r", Limit: "day", Identity: fmt.Sprintf("k%02d", i), PeriodStartMs: 1, Quota: 9, Count: 1})
		}
		r := rep("e1", 1, 1, us...)
		r.Quotas = qs
		if _, _, _, err := g.add(now, r); err != nil {
			t.Fatal(err)
		}
		return g.flush(now, time.Hour)
	}
	first := forward()
	for range 5 {
		if again := forward(); !proto.Equal(first, again) {
			t.Fatalf("the same report forwarded in another order:\n%v\n%v", first, again)
		}
	}
	if u := first.Usage; u[0].Identity != "k11" || u[len(u)-1].Identity != "k36" {
		t.Errorf("forward's first %q and last %q, want k11 (refused 2, of the busiest the first name) and k36 (nothing, the last name)", u[0].Identity, u[len(u)-1].Identity)
	}
	if q := first.Quotas; q[0].Identity != "k00" || q[len(q)-1].Identity != "k39" {
		t.Errorf("quotas %q … %q, want by name", q[0].Identity, q[len(q)-1].Identity)
	}
}

// Quota counts are the region's own (read from its shared counters), so the merge keeps
// the largest of each (rule, limit, identity, period), as the leader does per region.
func TestMergeQuotas(t *testing.T) {
	g := newMerger("us-east", 10, 10, 10, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	q := func(id string, count int64, period int64) *allotv1.QuotaCount {
		return &allotv1.QuotaCount{Rule: "r", Limit: "daily", Identity: id, PeriodStartMs: period, Quota: 1000, Count: count}
	}
	r1, r2 := rep("e1", 1, 1), rep("e2", 1, 1)
	r1.Quotas = []*allotv1.QuotaCount{q("a", 40, 1), q("b", 5, 1)}
	r2.Quotas = []*allotv1.QuotaCount{q("a", 42, 1), q("a", 3, 2)}
	for _, r := range []*allotv1.ReportRequest{r1, r2} {
		if _, _, _, err := g.add(now, r); err != nil {
			t.Fatal(err)
		}
	}
	got := map[quotaKey]int64{}
	for _, x := range g.flush(now, time.Hour).Quotas {
		got[quotaKey{x.Rule, x.Limit, x.Identity, x.PeriodStartMs}] = x.Count
	}
	want := map[quotaKey]int64{{"r", "daily", "a", 1}: 42, {"r", "daily", "b", 1}: 5, {"r", "daily", "a", 2}: 3}
	if len(got) != len(want) {
		t.Fatalf("quotas %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("quota %v = %d, want %d", k, got[k], v)
		}
	}
}

// An invalid report is refused whole, with an error naming what is wrong, and merges
// nothing.
func TestMergeRefusesInvalid(t *testing.T) {
	g := newMerger("us-east", 2, 2, 2, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	for name, c := range map[string]struct {
		mut  func(r *allotv1.ReportRequest)
		want string
	}{
		"other region": {func(r *allotv1.ReportRequest) { r.Region = "eu-west" }, `region "eu-west"`},
		"no enforcer":  {func(r *allotv1.ReportRequest) { r.EnforcerId = "" }, "enforcer_id"},
		"empty":        {func(r *allotv1.ReportRequest) { r.IntervalEndMs = r.IntervalStartMs }, "interval"},
		"negative":     {func(r *allotv1.ReportRequest) { r.Usage[0].Refused = -1 }, "usage[0] (r k)"},
		"NaN":          {func(r *allotv1.ReportRequest) { r.Usage[0].Error = math.NaN() }, "usage[0] (r k)"},
		"too many":     {func(r *allotv1.ReportRequest) { r.Usage = append(r.Usage, use("x", 1, 0, 0, 0), use("y", 1, 0, 0, 0)) }, "3 usage entries"},
		"members":      {func(r *allotv1.ReportRequest) { r.Members = []*allotv1.Member{{EnforcerId: "x"}} }, "do not chain"},
		"bad quota": {func(r *allotv1.ReportRequest) {
			r.Quotas = []*allotv1.QuotaCount{{Rule: "r", Limit: "l", Identity: "i"}}
		}, "quotas[0]"},
		"omitted NaN":   {func(r *allotv1.ReportRequest) { r.OmittedTokens = math.Inf(1) }, "omitted_tokens"},
		"fenced_seen":   {func(r *allotv1.ReportRequest) { r.FencedSeen = maxFencedSeen + 1 }, "fenced_seen"},
		"nil usage row": {func(r *allotv1.ReportRequest) { r.Usage[0] = nil }, "usage[0] is nil"},
	} {
		r := rep("e1", 1, 1, use("k", 1, 0, 0, 0))
		c.mut(r)
		_, _, _, err := g.add(now, r)
		if !errors.Is(err, ErrInvalidReport) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want ErrInvalidReport naming %q", name, err, c.want)
		}
	}
	if len(g.members) != 0 || len(g.usage) != 0 {
		t.Errorf("invalid reports merged something: %d members, %d identities", len(g.members), len(g.usage))
	}
}

// A member's report is urgent (forwarded at once) when it acknowledges a new set, is
// early or final; a final member is forgotten once the leader accepted a forward saying so.
func TestMergeUrgentAndFinal(t *testing.T) {
	g := newMerger("us-east", 10, 10, 10, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	if _, _, urgent, _ := g.add(now, rep("e1", 1, 3)); !urgent {
		t.Error("a first report naming version 3 is an acknowledgement: urgent")
	}
	if _, _, urgent, _ := g.add(now, rep("e1", 2, 3)); urgent {
		t.Error("the same version again is not urgent")
	}
	r := rep("e1", 3, 4)
	if _, _, urgent, _ := g.add(now, r); !urgent {
		t.Error("version 4 after 3 is an acknowledgement: urgent")
	}
	fin := rep("e1", 4, 4)
	fin.Final = true
	if _, _, urgent, _ := g.add(now, fin); !urgent {
		t.Error("a final report is urgent")
	}
	req := g.flush(now, time.Hour)
	if !req.Ack || len(req.Members) != 1 || !req.Members[0].Final {
		t.Fatalf("forward %v: want ack, e1 final", req)
	}
	g.confirm(req, now, 0, 0)
	if len(g.members) != 0 {
		t.Errorf("e1 still listed after the leader accepted its final report")
	}
}

// The members all count one store's marks of fenced enforcers: a forward says the largest
// they said since the last one, and the next forward starts again from none.
func TestMergeForwardsFencedSeen(t *testing.T) {
	g := newMerger("us-east", 100, 100, 100, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	for i, n := range []uint32{1, 3, 0} {
		r := rep(fmt.Sprintf("e%d", i), 1, 1, use("k", 1, 0, 0, 0))
		r.FencedSeen = n
		if _, _, _, err := g.add(now, r); err != nil {
			t.Fatal(err)
		}
	}
	if req := g.flush(now, time.Hour); req.FencedSeen != 3 {
		t.Fatalf("fenced_seen %d, want the largest of 1, 3, 0", req.FencedSeen)
	}
	if _, _, _, err := g.add(now.Add(10*time.Second), rep("e0", 2, 1, use("k", 1, 0, 0, 0))); err != nil {
		t.Fatal(err)
	}
	if req := g.flush(now.Add(10*time.Second), time.Hour); req.FencedSeen != 0 {
		t.Fatalf("fenced_seen %d in the next forward, want 0", req.FencedSeen)
	}
}

// A forward carries the fence marks of the member report received last (all members read
// one store), dated by fence_marks_ago_ms, and each member's highest seq: the leader
// believes a mark that names it (issue 26 §3: an enforcer cut off alone behind an
// aggregator is released on its mark, as directly). The leader's answer confirms the seq
// and the newest set for the enforcer (heard_seq).
func TestMergeForwardsFenceMarks(t *testing.T) {
	g := newMerger("us-east", 100, 100, 100, 10*time.Second, t0)
	now := t0.Add(10 * time.Second)
	r := rep("e1", 7, 1, use("k", 1, 0, 0, 0))
	r.FenceMarks = []*allotv1.FenceMark{{Enforcer: "e3", Seq: 4}}
	if _, _, _, err := g.add(now, r); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := g.add(now.Add(2*time.Second), rep("e2", 5, 1, use("k", 1, 0, 0, 0))); err != nil {
		t.Fatal(err)
	}
	r = rep("e2", 6, 1, use("k", 1, 0, 0, 0))
	r.FenceMarks = []*allotv1.FenceMark{{Enforcer: "e3", Seq: 4}, {Enforcer: "e4", Seq: 9}}
	if _, _, _, err := g.add(now.Add(3*time.Second), r); err != nil {
		t.Fatal(err)
	}
	req := g.flush(now.Add(5*time.Second), time.Hour)
	if len(req.FenceMarks) != 2 || req.FenceMarksAgoMs != 2000 {
		t.Fatalf("forward's marks %v, %d ms ago; want e2's last report's two, 2000 ms", req.FenceMarks, req.FenceMarksAgoMs)
	}
	if req.Members[0].Seq != 7 || req.Members[1].Seq != 6 {
		t.Fatalf("members %v: want seq 7 (e1) and 6 (e2)", req.Members)
	}
	g.confirm(req, now.Add(5*time.Second), 3, 12)
	if m := g.members["e2"]; m.confirmedSeq != 6 || m.confirmedRev != 3 || m.confirmedVer != 12 ||
		!m.confirmed.Equal(now.Add(3*time.Second)) {
		t.Fatalf("e2 confirmed %v seq %d set %d/%d; want its report of +3s, seq 6, set 3/12", m.confirmed, m.confirmedSeq, m.confirmedRev, m.confirmedVer)
	}
	// No report since: the same marks, older; a report without marks clears them.
	if req := g.flush(now.Add(15*time.Second), time.Hour); len(req.FenceMarks) != 2 || req.FenceMarksAgoMs != 12000 {
		t.Fatalf("next forward's marks %v, %d ms ago; want the same two, 12000 ms", req.FenceMarks, req.FenceMarksAgoMs)
	}
	if _, _, _, err := g.add(now.Add(16*time.Second), rep("e1", 8, 1)); err != nil {
		t.Fatal(err)
	}
	if req := g.flush(now.Add(17*time.Second), time.Hour); len(req.FenceMarks) != 0 || req.FenceMarksAgoMs != 0 {
		t.Fatalf("marks %v, %d ms ago after a report that listed none; want none", req.FenceMarks, req.FenceMarksAgoMs)
	}
	for _, bad := range []*allotv1.ReportRequest{
		func() *allotv1.ReportRequest {
			r := rep("e1", 9, 1)
			r.FenceMarks = []*allotv1.FenceMark{{Seq: 1}}
			return r
		}(),
		func() *allotv1.ReportRequest { r := rep("e1", 9, 1); r.FenceMarksAgoMs = 5; return r }(),
	} {
		if _, _, _, err := g.add(now.Add(20*time.Second), bad); !errors.Is(err, ErrInvalidReport) {
			t.Errorf("report with marks %v, ago %d: err %v, want ErrInvalidReport", bad.FenceMarks, bad.FenceMarksAgoMs, err)
		}
	}
}
