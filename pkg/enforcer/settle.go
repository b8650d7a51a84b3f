package enforcer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

// Costs settled after the response (issue 22 §3; bucket/settle.go has the math).
//
// A check that asks to settle (Request.Settle) takes its estimate (Hits × the rule's cost)
// as any check, and, when allowed, records one marker per rule that took — in the rule's
// identity's slot, one extra store call each, only for checks that ask — and answers a
// handle naming them (Decision.SettleHandle). Enforcer.Settle(handle, actual) then takes
// actual × cost − estimate from every bucket of those rules, or gives it back, each
// marker once: an unknown, expired (Config.SettleWindow) or already settled handle is
// ErrUnknownSettle and changes nothing, also when two enforcers receive it at once (the
// store deletes the marker and adjusts the buckets in one atomic step). The estimate and
// the cost are read from the marker, never from the handle: a client that edits a handle
// can settle only markers whose random id it was given, and only by what it was checked
// for.
//
// A rule marked settle: true (rules.Rule.Settle) takes its hits after the fact, for
// callers without a handle (Envoy's hits sent on stream done): never refused, the
// buckets may go into debt. Envoy's negative hits give tokens back (Refund).
//
// Which way it errs: a settlement takes whatever the buckets hold, down to one burst below
// zero (debt); a cost beyond that is forgiven (over, by what exceeds one burst). A refund
// never fills a bucket above its burst (under, by the excess). A settlement that never
// arrives leaves the estimate (under for a request that cost more than estimated, over
// for one that cost less); so does one whose marker could not be recorded (the check
// then answers no handle). Leases are not settled: a busy key's enforcers spend what
// they hold leased after the debt arose (over, by at most those tokens, about 1.5 batches
// an enforcer), and a refund does not lift a refusal cached from Redis (under, until that
// retry time).

// ErrUnknownSettle is returned by Settle when a marker of the handle is not there
// (unknown, expired or settled already): nothing was settled for it. It wraps
// bucket.ErrNotMarked.
var ErrUnknownSettle = fmt.Errorf("enforcer: %w", bucket.ErrNotMarked)

var errNoSettler = errors.New("enforcer: no settling store configured")

// settleTake is one rule's take that a settlement handle names.
type settleTake struct {
	rule, identity string
	want, cost     int64
}

// settleHandle is the settlement handle (handle.go): "s1." + the marker id + "." +
// base64url(rule id NUL identity NUL …). Each rule's marker is "<id>:<rule id>" in its
// identity's slot.
var settleHandle = handleKind{prefix: "s1.", what: "settle handle", id: "marker id", pairs: "rules", maxID: 64}

func encodeSettle(id string, ts []settleTake) string {
	return settleHandle.encode(id, len(ts), func(i int) (string, string) { return ts[i].rule, ts[i].identity })
}

// decodeSettle reads a settlement handle; an error wraps ErrInvalid.
func decodeSettle(h string) (id string, ts []settleTake, err error) {
	id, err = settleHandle.decode(h, func(rule, identity string) { ts = append(ts, settleTake{rule: rule, identity: identity}) })
	if err != nil {
		return "", nil, err
	}
	return id, ts, nil
}

func markID(id, rule string) string { return id + ":" + rule }

// finishSettle, at the end of an allowed check that asked to settle, records a marker
// for each take sc.settle holds and names those recorded in d.SettleHandle. A marker the
// store could not record is left out: its estimate stands.
func (e *Enforcer) finishSettle(ctx context.Context, sc *scratch, d *Decision) {
	if !d.Allowed || len(sc.settle) == 0 {
		return
	}
	if e.settler == nil {
		e.metrics.settles[settleError].Add(float64(len(sc.settle)))
		return
	}
	id := newSlotID()
	kept := sc.settle[:0]
	for _, t := range sc.settle {
		err := e.settler.Mark(context.WithoutCancel(ctx), &bucket.Mark{Identity: t.identity, ID: markID(id, t.rule),
			Estimate: t.want, Cost: t.cost, TTL: e.cfg.SettleWindow})
		if err != nil {
			e.metrics.settles[settleError].Inc()
			if !errors.Is(err, bucket.ErrUnavailable) {
				e.log.Warn("could not record a settlement marker: the estimate stands", "rule", t.rule, "error", err)
			}
			continue
		}
		kept = append(kept, t)
	}
	if len(kept) > 0 {
		d.SettleHandle = encodeSettle(id, kept)
	}
}

// SettleResult is what a settlement did.
type SettleResult struct {
	// Settled is how many rules' takes were settled.
	Settled int
	// Rule and Limit name the bucket with the fewest tokens after the settlement, and
	// Remaining its whole tokens: negative while it is in debt.
	Rule, Limit string
	Remaining   int64
}

// Settle settles a check's handle (Decision.SettleHandle) at actual (in the unit of the
// check's Hits): each rule's buckets are taken actual × cost − estimate from, or given it
// back (never above their burst; into debt of at most one burst). It returns an error
// wrapping ErrUnknownSettle when a rule's marker is not there (unknown, expired, settled
// already, or its rule is gone from the rules: the estimate stands; the others are
// settled), ErrInvalid for a handle this enforcer cannot read or an actual out of
// [0, Limits.MaxHits × 1000], otherwise the store's error (that rule is not settled and
// may be settled again, within the window, once the store answers).
func (e *Enforcer) Settle(ctx context.Context, handle string, actual int64) (SettleResult, error) {
	id, ts, err := decodeSettle(handle)
	if err != nil {
		return SettleResult{}, err
	}
	if most := e.cfg.Limits.MaxHits * 1000; actual < 0 || actual > most {
		return SettleResult{}, fmt.Errorf("%w: cost %d, must be in [0, %d]", ErrInvalid, actual, most)
	}
	if e.settler == nil {
		return SettleResult{}, errNoSettler
	}
	snap := e.cfg.Rules.Current()
	now := e.clock.Now()
	sc := e.scratch.Get().(*scratch)
	defer e.putScratch(sc)
	var out SettleResult
	var errs []error
	for _, t := range ts {
		var r *rules.Compiled
		if snap != nil {
			r = snap.Rule(t.rule)
		}
		if r == nil || len(r.Global) == 0 {
			e.metrics.settles[settleUnknown].Inc()
			errs = append(errs, fmt.Errorf("%w: rule %q is no longer in the rules: its estimate stands", ErrUnknownSettle, t.rule))
			continue
		}
		m := rules.Matched{Rule: r, Identity: t.identity}
		lim := e.limitsOf(sc, &m, now)
		res, err := e.settler.Settle(ctx, &bucket.Settlement{Identity: t.identity, Limits: lim.l, ID: markID(id, t.rule), Actual: actual})
		switch {
		case errors.Is(err, bucket.ErrNotMarked):
			e.metrics.settles[settleUnknown].Inc()
			errs = append(errs, fmt.Errorf("%w: rule %q", ErrUnknownSettle, t.rule))
			continue
		case errors.Is(err, bucket.ErrInvalid):
			errs = append(errs, fmt.Errorf("%w: settle: %w", ErrInvalid, err))
			continue
		case err != nil:
			e.metrics.settles[settleError].Inc()
			errs = append(errs, err)
			continue
		}
		e.metrics.settles[settleSettled].Inc()
		if out.Settled == 0 || res.Remaining < out.Remaining {
			out.Rule, out.Limit, out.Remaining = r.ID, lim.l[res.Limiting].Name, res.Remaining
		}
		out.Settled++
	}
	return out, errors.Join(errs...)
}

// takeAfter takes want tokens from m's buckets after the fact (a settle: true rule): never
// refused, the buckets may go into debt. The result is an allowed answer with the
// buckets' level after it.
func (e *Enforcer) takeAfter(ctx context.Context, m *rules.Matched, lim limits, want int64, res *bucket.Result) error {
	if e.settler == nil {
		return errNoSettler
	}
	r, err := e.settler.Settle(ctx, &bucket.Settlement{Identity: m.Identity, Limits: lim.l, Delta: want})
	if err != nil {
		return err
	}
	e.metrics.settles[settleUnmarked].Inc()
	i := r.Limiting
	*res = bucket.Result{Granted: want, Limiting: i, Remaining: max(r.Remaining, 0), Source: r.Source,
		Reset: time.Duration(lim.l[i].MicrosUntil(float64(r.Remaining), lim.l[i].Burst)) * time.Microsecond}
	return nil
}

// Refund gives hits × cost tokens back, never above the burst, to the buckets of every
// enforcing rule that req matches with rate limits and no in-flight limit (Envoy's
// is_negative_hits; Hits 0 means 1, and a Peek gives nothing). A rule with an in-flight
// limit keeps what negative hits mean to it: a slot released (ReleaseOldest), no tokens.
// It returns how many rules were refunded. A refund carries no handle: it is for trusted
// callers (a gateway), and bounded by the burst. Invalid input is ErrInvalid.
func (e *Enforcer) Refund(ctx context.Context, req *Request) (int, error) {
	if err := e.Validate(req); err != nil {
		return 0, err
	}
	snap := e.cfg.Rules.Current()
	if snap == nil || e.settler == nil || req.Peek {
		return 0, nil // Peek: negative hits of 0 give nothing back
	}
	hits := max(req.Hits, 1)
	now := e.clock.Now()
	sc := e.scratch.Get().(*scratch)
	defer e.putScratch(sc)
	sc.matched = snap.Match(&req.Attrs, now, sc.matched[:0])
	if snap.HasReplaces() {
		sc.matched = rules.DropReplaced(sc.matched, req.Replaced)
	}
	n := 0
	var errs []error
	for i := range sc.matched {
		m := &sc.matched[i]
		if m.Rule.Mode != rules.ModeEnforce || len(m.Rule.Global) == 0 || m.Rule.Inflight != nil || rules.NoTokens(m.Rule.Limits) {
			continue // a rule with an in-flight limit: its negative hits release a slot (ReleaseOldest), no tokens
		}
		want, ok := tokens(m.Cost, hits)
		if !ok || want > bucket.MaxSettle {
			continue
		}
		lim := e.limitsOf(sc, m, now)
		if _, err := e.settler.Settle(ctx, &bucket.Settlement{Identity: m.Identity, Limits: lim.l, Delta: -want}); err != nil {
			e.metrics.settles[settleError].Inc()
			errs = append(errs, err)
			continue
		}
		e.metrics.settles[settleUnmarked].Inc()
		n++
	}
	return n, errors.Join(errs...)
}

// The settlement results, for allot_enforcer_settlements_total.
const (
	settleSettled = iota
	settleUnknown
	settleUnmarked
	settleError
	numSettleResults
)

var settleResultNames = [numSettleResults]string{"settled", "unknown", "unmarked", "error"}
