package aggregator

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// ErrInvalidReport is wrapped by every error Add returns for a report it refuses.
var ErrInvalidReport = errors.New("aggregator: invalid report")

// ErrTooManyMembers: a report from an enforcer beyond MaxMembers.
var ErrTooManyMembers = errors.New("aggregator: too many enforcers behind this aggregator")

// maxNameLen bounds names as the balancer does (balancer.MaxNameLen).
const maxNameLen = 512

type usageKey struct{ rule, identity string }

type quotaKey struct {
	rule, limit, identity string
	period                int64
}

// member is one enforcer behind the aggregator.
type member struct {
	maxSeq uint64
	bits   uint64 // bit d: seq maxSeq-d was merged
	// What it last said, and when (the aggregator's clock).
	heard     time.Time
	rev       int64
	ver       uint64
	final     bool
	lastEndMs int64 // the end of its last report's interval (coverage counts from it)
	// Since the last flush: its reports merged, those with recent rates, and the interval
	// milliseconds they cover.
	reports, recent uint32
	coveredMs       int64
	// confirmed: the latest heard of this member the leader accepted in a forward (zero:
	// none yet), the seq the forward named (Member.seq) and the newest set the leader had
	// made when it took it. The enforcer is told it was heard then
	// (ReportResponse.heard_ago_ms, heard_seq, share_leader_rev, share_version).
	confirmed    time.Time
	confirmedSeq uint64
	confirmedRev int64
	confirmedVer uint64
}

// relay fills resp's relayed fields at now: when the leader last confirmed hearing m,
// which report of it that was, and the newest set the leader had made then (none yet:
// heard_ago_ms -1).
func (m *member) relay(now time.Time, resp *allotv1.ReportResponse) {
	resp.Relayed, resp.HeardAgoMs = true, -1
	if !m.confirmed.IsZero() {
		resp.HeardAgoMs = max(now.Sub(m.confirmed).Milliseconds(), 0)
		resp.HeardSeq, resp.ShareLeaderRev, resp.ShareVersion = m.confirmedSeq, m.confirmedRev, m.confirmedVer
	}
}

// seen records seq; true when it was merged before (a retry). As balancer's enforcerState.
func (m *member) seen(seq uint64) bool {
	switch {
	case m.bits == 0 || seq >= m.maxSeq+64:
		m.maxSeq, m.bits = seq, 1
	case seq > m.maxSeq:
		m.bits = m.bits<<(seq-m.maxSeq) | 1
		m.maxSeq = seq
	case m.maxSeq-seq < 64:
		b := uint64(1) << (m.maxSeq - seq)
		if m.bits&b != 0 {
			return true
		}
		m.bits |= b
	default:
		m.maxSeq, m.bits = seq, 1
	}
	return false
}

// merger is one interval's merge of a region's reports, and what the aggregator knows of
// each enforcer behind it. Not safe for concurrent use (the Aggregator's mutex guards it).
//
// The merge: per (rule, identity) admitted, refused, recent_rate and error are summed
// (regional_rate is the region's, the same in every report: the largest is kept). Each
// part is an enforcer's Space-Saving summary, whose true count lies in [count, count +
// error]; the true count of the merge is the sum of the parts', so it lies in [Σ count,
// Σ count + Σ error]: summing the error bounds keeps the bound, exactly the numbers the
// leader would have summed had the reports come to it directly. An identity one enforcer
// left out of its report is in that report's omitted_tokens, which are summed too.
//
// Bounded: at most 2 × maxEntries identities are held; a new one past that goes into
// omitted_identities/omitted_tokens at once, and a flush forwards the maxEntries with the
// most refused then the most tokens (the rest omitted), so a client inventing keys costs
// a bounded table, never more memory. Quota counts are the region's own counts read from
// its shared counters (not per-enforcer parts), so the merge keeps the largest for each
// (rule, limit, identity, period), as the leader does per region; at most maxQuotas.
type merger struct {
	region                       string
	maxEntries, maxQuotas, maxMs int
	interval                     time.Duration

	start         time.Time // the interval being merged began (the last flush)
	usage         map[usageKey]*allotv1.IdentityUsage
	omittedIDs    uint64
	omittedTokens float64
	recentWindow  uint32
	fencedSeen    uint32 // the largest ReportRequest.fenced_seen merged (all count one store)
	// The fence marks of the member report received last, and when: all members read one
	// store, so the newest list is the region's (kept across flushes until a newer one).
	marks         []*allotv1.FenceMark
	marksAt       time.Time
	quotas        map[quotaKey]*allotv1.QuotaCount
	quotasDropped uint64
	members       map[string]*member
	early, ack    bool
}

func newMerger(region string, maxEntries, maxQuotas, maxMembers int, interval time.Duration, start time.Time) *merger {
	return &merger{region: region, maxEntries: maxEntries, maxQuotas: maxQuotas, maxMs: maxMembers, interval: interval,
		start: start, usage: map[usageKey]*allotv1.IdentityUsage{}, quotas: map[quotaKey]*allotv1.QuotaCount{},
		members: map[string]*member{}}
}

// maxFencedSeen is the leader's bound on fenced_seen (balancer.MaxFencedSeen).
const maxFencedSeen = 4096

func finite(v float64) bool { return v >= 0 && !math.IsInf(v, 0) } // false for NaN too

// validate checks an enforcer's report whole, naming what is wrong, before anything is
// merged: the same checks as the leader's, and an aggregator believes no report of
// another region and takes no members (aggregators do not chain).
func (g *merger) validate(r *allotv1.ReportRequest) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidReport}, a...)...)
	}
	switch {
	case r == nil:
		return bad("nil report")
	case r.Region != g.region:
		return bad("region %.64q: this aggregator merges region %q's reports only", r.Region, g.region)
	case r.EnforcerId == "" || len(r.EnforcerId) > maxNameLen:
		return bad("enforcer_id %.64q: empty or longer than %d bytes", r.EnforcerId, maxNameLen)
	case r.IntervalEndMs <= r.IntervalStartMs:
		return bad("interval [%d, %d) ms is empty", r.IntervalStartMs, r.IntervalEndMs)
	case len(r.Usage) > g.maxEntries:
		return bad("%d usage entries, more than %d", len(r.Usage), g.maxEntries)
	case len(r.Quotas) > g.maxEntries:
		return bad("%d quota counts, more than %d", len(r.Quotas), g.maxEntries)
	case !finite(r.OmittedTokens):
		return bad("omitted_tokens %g, must be finite and >= 0", r.OmittedTokens)
	case r.FencedSeen > maxFencedSeen:
		return bad("fenced_seen %d, more than %d", r.FencedSeen, maxFencedSeen)
	case len(r.FenceMarks) > bucket.MaxFenceMarks:
		return bad("%d fence_marks, more than %d", len(r.FenceMarks), bucket.MaxFenceMarks)
	case r.FenceMarksAgoMs != 0:
		return bad("fence_marks_ago_ms %d: an enforcer's report says none (aggregators do not chain)", r.FenceMarksAgoMs)
	case len(r.Members) > 0:
		return bad("%d members: an enforcer's report lists none (aggregators do not chain)", len(r.Members))
	}
	for i, m := range r.FenceMarks {
		if m == nil || m.Enforcer == "" || len(m.Enforcer) > bucket.MaxSightLen {
			return bad("fence_marks[%d]: enforcer %.64q: empty or longer than %d bytes", i, m.GetEnforcer(), bucket.MaxSightLen)
		}
	}
	for i, u := range r.Usage {
		switch {
		case u == nil:
			return bad("usage[%d] is nil", i)
		case u.Rule == "" || u.Identity == "" || len(u.Rule) > maxNameLen || len(u.Identity) > maxNameLen:
			return bad("usage[%d]: rule %.64q identity %.64q: empty or longer than %d bytes", i, u.Rule, u.Identity, maxNameLen)
		case !finite(u.Admitted) || !finite(u.Refused) || !finite(u.Error) || !finite(u.RegionalRate) || !finite(u.RecentRate) || !finite(u.RecentTokens):
			return bad("usage[%d] (%s %s): admitted %g refused %g error %g regional_rate %g recent_rate %g recent_tokens %g: must be finite and >= 0",
				i, u.Rule, u.Identity, u.Admitted, u.Refused, u.Error, u.RegionalRate, u.RecentRate, u.RecentTokens)
		}
	}
	for i, q := range r.Quotas {
		switch {
		case q == nil:
			return bad("quotas[%d] is nil", i)
		case q.Rule == "" || q.Limit == "" || q.Identity == "" ||
			len(q.Rule) > maxNameLen || len(q.Limit) > maxNameLen || len(q.Identity) > maxNameLen:
			return bad("quotas[%d]: rule %.64q limit %.64q identity %.64q: empty or longer than %d bytes", i, q.Rule, q.Limit, q.Identity, maxNameLen)
		case q.PeriodStartMs <= 0 || q.Quota < 0 || q.Count < 0:
			return bad("quotas[%d] (%s %s %s): period_start_ms %d quota %d count %d: must be > 0, >= 0, >= 0",
				i, q.Rule, q.Limit, q.Identity, q.PeriodStartMs, q.Quota, q.Count)
		}
	}
	return nil
}

// add merges one enforcer's report at now. dup: a retry of a report already merged
// (nothing changes); urgent: it asks for a forward at once (an early report, an
// acknowledgement — a new share version — or a final report).
func (g *merger) add(now time.Time, r *allotv1.ReportRequest) (m *member, dup, urgent bool, err error) {
	if err := g.validate(r); err != nil {
		return nil, false, false, err
	}
	m = g.members[r.EnforcerId]
	fresh := m == nil
	if m == nil {
		if len(g.members) >= g.maxMs {
			return nil, false, false, fmt.Errorf("%w: %d already", ErrTooManyMembers, len(g.members))
		}
		m = &member{}
		g.members[r.EnforcerId] = m
	} else if m.bits != 0 && m.maxSeq >= r.Seq && m.maxSeq-r.Seq < 64 && m.bits&(uint64(1)<<(m.maxSeq-r.Seq)) != 0 {
		return m, true, false, nil
	}
	m.seen(r.Seq)
	// An acknowledgement: a set other than the one it last reported (a new enforcer: any set).
	acked := m.rev != r.ShareLeaderRev || m.ver != r.ShareVersion
	if fresh {
		acked = r.ShareVersion != 0
	}
	m.heard, m.rev, m.ver, m.final = now, r.ShareLeaderRev, r.ShareVersion, r.Final
	start := max(r.IntervalStartMs, m.lastEndMs)
	covered := min(max(r.IntervalEndMs-start, 0), 2*g.interval.Milliseconds())
	m.lastEndMs = max(m.lastEndMs, r.IntervalEndMs)
	m.reports++
	m.coveredMs += covered
	if r.RecentWindowMs > 0 {
		m.recent++
		g.recentWindow = max(g.recentWindow, r.RecentWindowMs)
	}
	g.omittedIDs += r.OmittedIdentities
	g.omittedTokens += r.OmittedTokens
	g.fencedSeen = max(g.fencedSeen, r.FencedSeen)
	if !now.Before(g.marksAt) {
		g.marks, g.marksAt = r.FenceMarks, now
	}
	for _, u := range r.Usage {
		k := usageKey{u.Rule, u.Identity}
		e := g.usage[k]
		if e == nil {
			if len(g.usage) >= 2*g.maxEntries {
				g.omittedIDs++
				g.omittedTokens += u.Admitted + u.Refused
				continue
			}
			e = &allotv1.IdentityUsage{Rule: u.Rule, Identity: u.Identity}
			g.usage[k] = e
		}
		e.Admitted += u.Admitted
		e.Refused += u.Refused
		e.Error += u.Error // a merged Space-Saving summary's error is at most the sum of its parts'
		e.RecentRate += u.RecentRate
		e.RecentTokens += u.RecentTokens
		e.RegionalRate = max(e.RegionalRate, u.RegionalRate)
		e.Draining = e.Draining || u.Draining // one region, one bucket: any enforcer's low take says it
	}
	for _, q := range r.Quotas {
		k := quotaKey{q.Rule, q.Limit, q.Identity, q.PeriodStartMs}
		e := g.quotas[k]
		if e == nil {
			if len(g.quotas) >= g.maxQuotas {
				g.quotasDropped++
				continue
			}
			e = &allotv1.QuotaCount{Rule: q.Rule, Limit: q.Limit, Identity: q.Identity, PeriodStartMs: q.PeriodStartMs}
			g.quotas[k] = e
		}
		e.Quota = max(e.Quota, q.Quota)
		e.Count = max(e.Count, q.Count) // the region's own count: the largest is the newest
	}
	g.early = g.early || r.Early
	urgent = r.Early || r.Final || acked
	g.ack = g.ack || (urgent && !r.Early)
	return m, false, urgent, nil
}

// flush returns the merged report of the interval [start, now) for upstream and starts a
// new interval: every member (what it last said, heard how long ago), the usage, the
// quotas. nil when no enforcer is known. Members silent for forget are dropped first:
// the leader holds them as silent from what it was last told.
func (g *merger) flush(now time.Time, forget time.Duration) *allotv1.ReportRequest {
	for id, m := range g.members {
		if now.Sub(m.heard) > forget {
			delete(g.members, id)
		}
	}
	if len(g.members) == 0 {
		g.reset(now)
		return nil
	}
	end := max(now.UnixMilli(), g.start.UnixMilli()+1)
	req := &allotv1.ReportRequest{Region: g.region, IntervalStartMs: g.start.UnixMilli(), IntervalEndMs: end,
		Early: g.early, Ack: g.ack, OmittedIdentities: g.omittedIDs, OmittedTokens: g.omittedTokens,
		RecentWindowMs: g.recentWindow, FencedSeen: g.fencedSeen}
	if len(g.marks) > 0 {
		req.FenceMarks, req.FenceMarksAgoMs = g.marks, max(now.Sub(g.marksAt).Milliseconds(), 0)
	}
	ids := make([]string, 0, len(g.members))
	for id := range g.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		m := g.members[id]
		req.Members = append(req.Members, &allotv1.Member{EnforcerId: id, ShareLeaderRev: m.rev, ShareVersion: m.ver,
			Final: m.final, HeardAgoMs: max(now.Sub(m.heard).Milliseconds(), 0), Reports: m.reports,
			CoveredMs: m.coveredMs, RecentReports: m.recent, Seq: m.maxSeq})
		m.reports, m.recent, m.coveredMs = 0, 0, 0
	}
	req.Usage = make([]*allotv1.IdentityUsage, 0, len(g.usage))
	for _, u := range g.usage {
		req.Usage = append(req.Usage, u)
	}
	// Pressured first (refused), then the busiest, then by name: past maxEntries the rest
	// go to omitted, and the same merge forwards the same report whatever the maps' order
	// (regionsim's runs through aggregators repeat exactly, as its direct ones do).
	slices.SortFunc(req.Usage, func(a, b *allotv1.IdentityUsage) int {
		if c := cmp.Compare(b.Refused, a.Refused); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Admitted+b.Refused, a.Admitted+a.Refused); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Rule, b.Rule); c != 0 {
			return c
		}
		return cmp.Compare(a.Identity, b.Identity)
	})
	if len(req.Usage) > g.maxEntries {
		for _, u := range req.Usage[g.maxEntries:] {
			req.OmittedIdentities++
			req.OmittedTokens += u.Admitted + u.Refused
		}
		req.Usage = req.Usage[:g.maxEntries]
	}
	for _, q := range g.quotas {
		req.Quotas = append(req.Quotas, q)
	}
	slices.SortFunc(req.Quotas, func(a, b *allotv1.QuotaCount) int {
		return cmp.Or(cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Identity, b.Identity), cmp.Compare(a.PeriodStartMs, b.PeriodStartMs))
	})
	g.reset(now)
	return req
}

// confirm records that the leader accepted req (a flush of this merger sent at sent),
// answering that the newest set it had made was (rev, ver): each member is confirmed
// heard as of what req said, and a member whose final report the leader now knows is
// forgotten.
func (g *merger) confirm(req *allotv1.ReportRequest, sent time.Time, rev int64, ver uint64) {
	for _, x := range req.Members {
		m := g.members[x.EnforcerId]
		if m == nil {
			continue
		}
		at := sent.Add(-time.Duration(x.HeardAgoMs) * time.Millisecond)
		if at.After(m.confirmed) {
			m.confirmed, m.confirmedSeq, m.confirmedRev, m.confirmedVer = at, x.Seq, rev, ver
		}
		if x.Final && !m.heard.After(at) {
			delete(g.members, x.EnforcerId)
		}
	}
}

// Merger is an Aggregator's merge and member table without its election, RPCs and lock:
// regionsim runs one per region on its virtual clock, so the same code merges reports,
// forwards them and answers the enforcers. Not safe for concurrent use.
type Merger struct {
	g      *merger
	forget time.Duration
}

// NewMerger returns region's merge under cfg's Interval, MaxEntries, MaxQuotas,
// MaxMembers and Forget (a zero one takes DefaultConfig's), its first interval starting
// at start.
func NewMerger(region string, cfg Config, start time.Time) *Merger {
	def := DefaultConfig()
	pick := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	if cfg.Interval <= 0 {
		cfg.Interval = def.Interval
	}
	if cfg.Forget <= 0 {
		cfg.Forget = def.Forget
	}
	g := newMerger(region, pick(cfg.MaxEntries, def.MaxEntries), pick(cfg.MaxQuotas, def.MaxQuotas),
		pick(cfg.MaxMembers, def.MaxMembers), cfg.Interval, start)
	return &Merger{g: g, forget: cfg.Forget}
}

// Add merges an enforcer's report at now as the elected aggregator's Report does, and
// returns its answer (accepted, relayed: ReportResponse.heard_ago_ms, heard_seq and the
// newest set as the leader last confirmed; no quota answer) and whether it asks for a
// forward at once (an acknowledgement, an early or final report; never a retry). A report
// the aggregator refuses returns an error wrapping ErrInvalidReport or ErrTooManyMembers.
func (m *Merger) Add(now time.Time, r *allotv1.ReportRequest) (resp *allotv1.ReportResponse, urgent bool, err error) {
	mem, dup, urgent, err := m.g.add(now, r)
	if err != nil {
		return nil, false, err
	}
	resp = &allotv1.ReportResponse{Accepted: true}
	mem.relay(now, resp)
	return resp, urgent && !dup, nil
}

// Flush returns the forward of the interval ending at now, members silent for Forget
// dropped first; nil when no enforcer is known. The caller names it (EnforcerId, Seq).
func (m *Merger) Flush(now time.Time) *allotv1.ReportRequest { return m.g.flush(now, m.forget) }

// Confirm records that the leader accepted req (a Flush at sent) with resp.
func (m *Merger) Confirm(req *allotv1.ReportRequest, sent time.Time, resp *allotv1.ReportResponse) {
	m.g.confirm(req, sent, resp.GetShareLeaderRev(), resp.GetShareVersion())
}

func (g *merger) reset(now time.Time) {
	g.start = now
	g.usage = make(map[usageKey]*allotv1.IdentityUsage, len(g.usage))
	g.quotas = make(map[quotaKey]*allotv1.QuotaCount, len(g.quotas))
	g.omittedIDs, g.omittedTokens, g.recentWindow, g.fencedSeen, g.early, g.ack = 0, 0, 0, 0, false, false
}
