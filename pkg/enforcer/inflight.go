package enforcer

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

// In-flight limits (rules.InflightLimit).
//
// A check that passes every rule acquires one slot of each matching enforcing rule's
// in-flight limit, after that rule's buckets granted, and answers a handle
// (Decision.Handle) naming the slots it holds. Release(handle) gives them back when the
// response is done; a slot never released comes back by itself after the limit's timeout
// (bucket.InflightStore). A check refused by a later rule gives back the slots it had
// acquired before answering (one more store call, on refusals only). Shadow rules
// acquire nothing.
//
// The cap this region holds for an identity is floor(global cap × the identity's share),
// the share its rates get (Config.Shares): the regions' caps sum to at most the global
// cap, so the split errs under by less than one request a region.
//
// Errors: a slot whose release is lost is held until the timeout (under, for at most the
// timeout); a request running longer than the timeout loses its slot while it runs (over,
// by the requests that outlive the timeout). Releases by count (ReleaseOldest, for
// Envoy's negative hits, which carry no handle) give back the key's oldest slot, which
// may be another request's: the count stays right, but a slot released early for a
// request still running and a later lost release of the real one together err over by
// one until the other's timeout.

// MaxHandleLen bounds a handle a client hands back to Release.
const MaxHandleLen = 4096

// maxHeld is the most in-flight slots one check holds (one per matching rule).
const maxHeld = 8

// ErrUnknownHandle is returned by Release when a slot of the handle is held no longer
// (released already, expired, or never acquired); the others of the handle were
// released. It wraps bucket.ErrUnknownHandle.
var ErrUnknownHandle = fmt.Errorf("enforcer: %w", bucket.ErrUnknownHandle)

// heldSlot is one slot a check holds: the in-flight limit's name and the identity.
type heldSlot struct {
	name, identity string
}

// slotHandle is the in-flight handle (handle.go): "h1." + the slot id + "." +
// base64url(name NUL identity NUL …). The slot id (16 random bytes, base64url) is the
// member of every slot set; the rest says where the slots are. A client can forge a
// handle but releases only slots whose id it knows.
var slotHandle = handleKind{prefix: "h1.", what: "handle", id: "slot id", pairs: "slots", maxID: bucket.MaxHandleLen}

func encodeHandle(id string, held []heldSlot) string {
	return slotHandle.encode(id, len(held), func(i int) (string, string) { return held[i].name, held[i].identity })
}

// decodeHandle reads a handle; an error wraps ErrInvalid.
func decodeHandle(h string) (id string, held []heldSlot, err error) {
	id, err = slotHandle.decode(h, func(name, identity string) { held = append(held, heldSlot{name: name, identity: identity}) })
	if err != nil {
		return "", nil, err
	}
	return id, held, nil
}

// newSlotID returns 16 random bytes in base64url (22 bytes).
func newSlotID() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// inflightStore is the store of in-flight slots: Config.Inflight, else the Store when it
// is one, else nil (in-flight limits then answer as a failed store: by the fail mode).
func (e *Enforcer) inflightStore() bucket.InflightStore {
	if e.cfg.Inflight != nil {
		return e.cfg.Inflight
	}
	if s, ok := e.cfg.Store.(bucket.InflightStore); ok {
		return s
	}
	return nil
}

var errNoInflightStore = errors.New("enforcer: no in-flight store configured")

// acquire holds one slot of m's in-flight limit at share, recording it in sc, and makes a
// refusal d's answer; chosen says whether d holds an allowed rule's budget. An in-flight
// limit that decides states its cap as Quota, the slots left as Remaining, and its timeout
// as Window and (refused) the wait until the oldest slot times out as Reset and
// RetryAfter. It returns an error only when ctx ended.
func (e *Enforcer) acquire(ctx context.Context, sc *scratch, m *rules.Matched, share float64, chosen *bool, d *Decision) error {
	in := m.Rule.Inflight
	if len(sc.held) == maxHeld {
		// More in-flight rules than a handle names: this one is not enforced for the check
		// (over). A check matches at most one enforcing rule a dimension (six), so never.
		return nil
	}
	if sc.slotID == "" {
		sc.slotID = newSlotID()
	}
	capNow := in.Cap
	if share != m.Rule.Share {
		capNow = in.CapFor(share)
	}
	h := bucket.Hold{Identity: m.Identity, Name: in.Name, Handle: sc.slotID, Cap: capNow, Timeout: in.Timeout,
		FailClosed: m.Rule.FailMode == rules.FailClosed}
	var res bucket.HoldResult
	err := errNoInflightStore
	if st := e.inflight; st != nil {
		res, err = st.Acquire(ctx, &h)
	}
	fillHold := func(r bucket.HoldResult) {
		d.Rule, d.Limit, d.Share, d.CountedBy = m.Rule.ID, in.Name, share, rules.CountedBy(m.Identity)
		d.identity = m.Identity
		d.Quota, d.Window = capNow, ceilSeconds(in.Timeout)
		d.Remaining = r.Remaining(capNow)
		d.Reset, d.Effective, d.RetryAfter = r.RetryAfter, 0, r.RetryAfter
		d.Source = r.Source
	}
	switch {
	case err != nil:
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		e.metrics.storeErrors[m.Rule.FailMode&1].Inc()
		if !errors.Is(err, bucket.ErrUnavailable) {
			e.log.Warn("in-flight store could not answer", "rule", m.Rule.ID, "fail-mode", failModeName(m.Rule.FailMode), "error", err)
		}
		if m.Rule.FailMode == rules.FailClosed {
			retry := e.cfg.FailClosedRetryAfter
			fillHold(bucket.HoldResult{InFlight: capNow, RetryAfter: retry})
			d.Allowed, d.Source = false, SourceFailClosed
		}
		// Fail open: allowed without a slot (nothing to release).
	case !res.Held:
		fillHold(res)
		d.Allowed = false
	default:
		sc.held = append(sc.held, heldSlot{name: in.Name, identity: m.Identity})
		// A rate limit stays an allowed answer's budget (the RateLimit fields speak of
		// tokens per window); an in-flight limit states it only when no rate applied.
		if !*chosen {
			fillHold(res)
			d.RetryAfter = 0
			*chosen = true
		}
	}
	return nil
}

// finishHeld, at the end of a check, names the slots it holds in d.Handle, or gives them
// back when the check was refused after acquiring them.
func (e *Enforcer) finishHeld(ctx context.Context, sc *scratch, d *Decision) {
	if len(sc.held) == 0 {
		return
	}
	if d.Allowed {
		d.Handle = encodeHandle(sc.slotID, sc.held)
		return
	}
	for _, h := range sc.held {
		hold := bucket.Hold{Identity: h.identity, Name: h.name, Handle: sc.slotID}
		if err := e.inflight.Release(context.WithoutCancel(ctx), &hold); err != nil {
			// The slot comes back at its timeout.
			e.log.Warn("could not give back an in-flight slot of a refused check", "limit", h.name, "error", err)
		}
	}
}

// Release gives back every slot a check's handle (Decision.Handle) holds, once. It
// returns nil when all were released; an error wrapping ErrUnknownHandle when one was
// held no longer (released already, expired, or never held; the others are released);
// ErrInvalid for a handle this enforcer cannot read; otherwise the store's error (the
// slot then comes back at its timeout).
func (e *Enforcer) Release(ctx context.Context, handle string) error {
	id, held, err := decodeHandle(handle)
	if err != nil {
		return err
	}
	if e.inflight == nil {
		return errNoInflightStore
	}
	snap := e.cfg.Rules.Current()
	var errs []error
	unknown := 0
	for _, h := range held {
		hold := bucket.Hold{Identity: h.identity, Name: h.name, Handle: id, Timeout: timeoutOf(snap, h.name)}
		if err := e.inflight.Release(ctx, &hold); err != nil {
			if errors.Is(err, bucket.ErrInvalid) {
				err = fmt.Errorf("%w: handle: %w", ErrInvalid, err)
			} else if errors.Is(err, bucket.ErrUnknownHandle) {
				err = fmt.Errorf("%w: limit %q", ErrUnknownHandle, h.name)
				unknown++
			}
			errs = append(errs, err)
		}
	}
	e.metrics.released(len(held)-len(errs), unknown)
	return errors.Join(errs...)
}

// timeoutOf is the timeout of the in-flight limit named name ("<rule id>/<limit>") in
// snap, or 0 when the rule is gone or changed (the store then forgets no expired slot
// before releasing).
func timeoutOf(snap *rules.Snapshot, name string) time.Duration {
	id, _, _ := strings.Cut(name, "/")
	if snap == nil {
		return 0
	}
	if r := snap.Rule(id); r != nil && r.Inflight != nil && r.Inflight.Name == name {
		return r.Inflight.Timeout
	}
	return 0
}

// ReleaseOldest gives back, for every enforcing rule with an in-flight limit that req
// matches, the oldest slot its identity holds: a release by count for callers without a
// handle (Envoy's is_negative_hits; see the package's in-flight notes for the error it
// brings). It returns how many slots were released; a rule whose identity holds none is
// skipped. Invalid input is ErrInvalid.
func (e *Enforcer) ReleaseOldest(ctx context.Context, req *Request) (int, error) {
	if err := e.Validate(req); err != nil {
		return 0, err
	}
	snap := e.cfg.Rules.Current()
	if snap == nil || e.inflight == nil {
		return 0, nil
	}
	sc := e.scratch.Get().(*scratch)
	defer e.putScratch(sc)
	sc.matched = snap.Match(&req.Attrs, e.clock.Now(), sc.matched[:0])
	if snap.HasReplaces() {
		sc.matched = rules.DropReplaced(sc.matched, req.Replaced)
	}
	n := 0
	var errs []error
	for i := range sc.matched {
		m := &sc.matched[i]
		if m.Rule.Mode != rules.ModeEnforce || m.Rule.Inflight == nil {
			continue
		}
		in := m.Rule.Inflight
		err := e.inflight.ReleaseOldest(ctx, &bucket.Hold{Identity: m.Identity, Name: in.Name, Timeout: in.Timeout})
		switch {
		case err == nil:
			n++
		case errors.Is(err, bucket.ErrUnknownHandle):
		default:
			errs = append(errs, err)
		}
	}
	e.metrics.released(n, 0)
	return n, errors.Join(errs...)
}
