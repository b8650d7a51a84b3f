package bucket

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// In-flight (concurrency) limits.
//
// An in-flight limit admits at most Cap requests of one identity at once. Each admitted
// request holds a slot named by a handle until it is released, or until Timeout after it
// was admitted, whichever comes first: every acquire first forgets the slots older than
// the timeout, so a slot whose release was lost (a gateway that crashed, a reply that
// never came) comes back by itself within the timeout. Which way it errs: a request that
// outlives the timeout loses its slot while it still runs, so up to the requests that
// outlived it may run over the cap (over); a release that is lost keeps its slot taken
// until the timeout (under, for at most the timeout).

// Bounds on what a Hold may carry.
const (
	// MaxConcurrent is the largest cap of an in-flight limit: a key holds at most this
	// many slots, so a client cannot grow a key's set without bound.
	MaxConcurrent = 100_000
	// MaxHandleLen is the longest handle, in bytes.
	MaxHandleLen = 64
	// MinHoldTimeout and MaxHoldTimeout bound how long a slot may be held.
	MinHoldTimeout = time.Millisecond
	MaxHoldTimeout = 24 * time.Hour
)

// ErrUnknownHandle is returned by Release when the handle holds no slot: it was never
// admitted, was released already, or expired (its timeout passed and an acquire forgot
// it). Nothing was released.
var ErrUnknownHandle = errors.New("bucket: unknown or expired handle")

// Hold asks for, or gives back, one in-flight slot of an identity's limit.
type Hold struct {
	// Identity names whose slots these are; the same identities as Request's, in the same
	// cluster slot as its buckets.
	Identity string
	// Name tells one identity's in-flight limits apart (a rule's "<id>/<limit>").
	Name string
	// Handle names the slot, unique among the holds of one (Identity, Name): the caller
	// makes it (random). Acquiring a handle that already holds a slot admits it again
	// without taking a second slot (a retried acquire). Ignored by ReleaseOldest.
	Handle string
	// Cap is the most slots held at once, in [0, MaxConcurrent]; 0 refuses every acquire.
	// Ignored by Release.
	Cap int64
	// Timeout is how long a slot is held without a release, in [MinHoldTimeout,
	// MaxHoldTimeout].
	Timeout time.Duration
	// FailClosed asks layers that answer while the store is unavailable (pkg/fallback) to
	// return ErrUnavailable instead of holding slots locally. Stores ignore it.
	FailClosed bool
}

// HoldResult is the answer to an acquire.
type HoldResult struct {
	// Held says whether the slot was admitted.
	Held bool
	// InFlight is how many slots are held after the acquire (this one included if held).
	InFlight int64
	// RetryAfter, when refused, is the wait until the oldest slot times out (a release may
	// come sooner).
	RetryAfter time.Duration
	// Source says which layer answered.
	Source Source
}

// Remaining is how many more slots the cap admits now.
func (r HoldResult) Remaining(cap int64) int64 { return max(cap-r.InFlight, 0) }

// InflightStore holds in-flight slots. Implementations are safe for concurrent use and
// validate the hold (ErrInvalid) before doing anything; other errors mean the store could
// not answer and nothing is known to have changed.
type InflightStore interface {
	// Acquire admits h.Handle if fewer than h.Cap slots are held, after forgetting the
	// slots held longer than h.Timeout, in one atomic step.
	Acquire(ctx context.Context, h *Hold) (HoldResult, error)
	// Release gives h.Handle's slot back; ErrUnknownHandle if it holds none. A second
	// release of one handle is ErrUnknownHandle: nothing is released twice. With
	// h.Timeout > 0 the slots older than it are forgotten first, so an expired handle is
	// unknown; with 0 (the caller no longer knows the limit) a slot not yet forgotten is
	// released.
	Release(ctx context.Context, h *Hold) error
	// ReleaseOldest gives back the oldest slot held for (h.Identity, h.Name), whoever
	// holds it: for callers that release by count and have no handle (Envoy's
	// is_negative_hits). ErrUnknownHandle if none is held.
	ReleaseOldest(ctx context.Context, h *Hold) error
}

// Validate checks a hold for Acquire and returns an error wrapping ErrInvalid that names
// the field.
func (h *Hold) Validate() error {
	if err := h.validateKey(true); err != nil {
		return err
	}
	if h.Cap < 0 || h.Cap > MaxConcurrent {
		return fmt.Errorf("%w: in-flight limit %q: cap %d, must be in [0, %d]", ErrInvalid, h.Name, h.Cap, MaxConcurrent)
	}
	return h.validateTimeout(false)
}

// validateKey checks what names the slot set (and the handle, withHandle).
func (h *Hold) validateKey(withHandle bool) error {
	switch {
	case h.Identity == "":
		return fmt.Errorf("%w: empty identity", ErrInvalid)
	case len(h.Identity) > MaxIdentityLen:
		return fmt.Errorf("%w: identity is %d bytes, more than %d", ErrInvalid, len(h.Identity), MaxIdentityLen)
	case h.Name == "":
		return fmt.Errorf("%w: identity %.64q: empty in-flight limit name", ErrInvalid, h.Identity)
	case len(h.Name) > MaxNameLen:
		return fmt.Errorf("%w: in-flight limit name is %d bytes, more than %d", ErrInvalid, len(h.Name), MaxNameLen)
	case withHandle && h.Handle == "":
		return fmt.Errorf("%w: in-flight limit %q: empty handle", ErrInvalid, h.Name)
	case withHandle && len(h.Handle) > MaxHandleLen:
		return fmt.Errorf("%w: in-flight limit %q: handle is %d bytes, more than %d", ErrInvalid, h.Name, len(h.Handle), MaxHandleLen)
	}
	return nil
}

// validateTimeout checks Timeout; orZero lets 0 through (Release: expire nothing first).
func (h *Hold) validateTimeout(orZero bool) error {
	if orZero && h.Timeout == 0 {
		return nil
	}
	if h.Timeout < MinHoldTimeout || h.Timeout > MaxHoldTimeout {
		return fmt.Errorf("%w: in-flight limit %q: timeout %v, must be in [%v, %v]", ErrInvalid, h.Name, h.Timeout, MinHoldTimeout, MaxHoldTimeout)
	}
	return nil
}

// ValidateRelease checks a hold for Release (handle needed; Timeout may be 0, meaning the
// store forgets no expired slot first) or, without handle, for ReleaseOldest (Timeout
// needed).
func (h *Hold) ValidateRelease(withHandle bool) error {
	if err := h.validateKey(withHandle); err != nil {
		return err
	}
	return h.validateTimeout(withHandle)
}

// holdRetry is a refused acquire's RetryAfter: until the oldest slot (held since oldest,
// Unix ms) times out, at least 1 ms.
func holdRetry(oldest, now int64, timeout time.Duration) time.Duration {
	w := time.Duration(oldest+timeout.Milliseconds()-now) * time.Millisecond
	return max(w, time.Millisecond)
}
