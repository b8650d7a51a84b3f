package enforcer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/rules"
)

const inflightRules = `
rules:
  - id: exports
    match: {endpoint: "POST /v1/exports"}
    limits: [{name: inflight, concurrent: 3, timeout: 30s}]
  - id: search
    match: {endpoint: "GET /v1/search"}
    limits:
      - {name: second, rate: 1, per: 1s, burst: 1}
      - {name: inflight, concurrent: 5, timeout: 30s}
  - id: upload
    match: {endpoint: "PUT /v1/upload"}
    limits: [{name: inflight, concurrent: 1, timeout: 10s}]
  - id: upload-global
    match: {endpoint: "PUT /v1/upload"}
    by: global
    limits: [{name: second, rate: 1, per: 1h, burst: 1}]
`

var exportsReq = rules.Attrs{APIKey: "k", Endpoint: "POST /v1/exports"}

func (r *rig) mem() *bucket.Memory { return r.store.(*bucket.Memory) }

// N holders are admitted with handles, the N+1st refused until a release or the timeout;
// a handle releases once.
func TestInflightCapReleaseAndTimeout(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, inflightRules, nil)
	var handles []string
	for i := range 3 {
		d := r.check(t, exportsReq)
		if !d.Allowed || d.Handle == "" || d.Rule != "exports" || d.Limit != "exports/inflight" || d.Quota != 3 || d.Remaining != int64(2-i) {
			t.Fatalf("holder %d: %+v, want allowed with a handle, %d remaining of 3", i+1, d, 2-i)
		}
		handles = append(handles, d.Handle)
		r.clk.Advance(time.Second)
	}
	d := r.check(t, exportsReq)
	if d.Allowed || d.Handle != "" || d.Limit != "exports/inflight" || d.RetryAfter != 27*time.Second || d.Source != SourceMemory {
		t.Fatalf("4th holder: %+v, want refused, retry after 27s (the oldest's timeout)", d)
	}
	if err := r.e.Release(ctx, handles[1]); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := r.e.Release(ctx, handles[1]); !errors.Is(err, ErrUnknownHandle) || !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("second Release: %v, want ErrUnknownHandle", err)
	}
	if d := r.check(t, exportsReq); !d.Allowed {
		t.Fatalf("after a release: %+v, want allowed", d)
	}
	if d := r.check(t, exportsReq); d.Allowed {
		t.Fatalf("full again: %+v, want refused", d)
	}
	// Nobody releases: the slots come back 30 s after each was admitted.
	r.clk.Advance(27 * time.Second) // the first holder's timeout
	if d := r.check(t, exportsReq); !d.Allowed {
		t.Fatalf("at the oldest's timeout: %+v, want allowed", d)
	}
	if err := r.e.Release(ctx, handles[0]); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("Release of an expired handle: %v, want ErrUnknownHandle", err)
	}
	if got := testMetric(t, r, "released"); got != 1 {
		t.Errorf("released counter %v, want 1", got)
	}
}

func testMetric(t *testing.T, r *rig, result string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "allot_enforcer_inflight_releases_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no allot_enforcer_inflight_releases_total{result=%q}", result)
	return 0
}

// Handles a client made up or mangled are ErrInvalid, never a crash.
func TestInflightReleaseBadHandles(t *testing.T) {
	r := newRig(t, inflightRules, nil)
	good := r.check(t, exportsReq).Handle
	for _, h := range []string{"", "x", "h1.", "h1.abc", "h1.abc.!!!", "h1..YQ", "h1.abc.YQ", strings.Repeat("h", MaxHandleLen+1),
		"h1.abc." + strings.Repeat("A", 100), "h1." + strings.Repeat("i", 65) + ".YQBi", good[:len(good)-2] + "**"} {
		if err := r.e.Release(context.Background(), h); !errors.Is(err, ErrInvalid) {
			t.Errorf("Release(%.40q): %v, want ErrInvalid", h, err)
		}
	}
	// A well-formed handle for slots nobody holds is unknown.
	forged := encodeHandle(newSlotID(), []heldSlot{{name: "exports/inflight", identity: "key:k"}})
	if err := r.e.Release(context.Background(), forged); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("forged handle: %v, want ErrUnknownHandle", err)
	}
	if n := r.mem().Held("key:k", "exports/inflight"); n != 1 {
		t.Fatalf("%d slots held after the forged release, want 1", n)
	}
}

// A rate refusal acquires nothing; a slot taken before a later rule refused is given back.
func TestInflightOnlyWhenAllowed(t *testing.T) {
	r := newRig(t, inflightRules, nil)
	search := rules.Attrs{APIKey: "k", Endpoint: "GET /v1/search"}
	if d := r.check(t, search); !d.Allowed || d.Handle == "" {
		t.Fatalf("first search: %+v", d)
	}
	if d := r.check(t, search); d.Allowed || d.Limit != "search/second" {
		t.Fatalf("second search: %+v, want refused by the rate", d)
	}
	if n := r.mem().Held("key:k", "search/inflight"); n != 1 {
		t.Fatalf("%d slots held after a rate refusal, want 1", n)
	}
	up := rules.Attrs{APIKey: "a", Endpoint: "PUT /v1/upload"}
	if d := r.check(t, up); !d.Allowed {
		t.Fatalf("first upload: %+v", d)
	}
	// Another key: its own slot is free, the global rule refuses after the slot was taken.
	if d := r.check(t, rules.Attrs{APIKey: "b", Endpoint: "PUT /v1/upload"}); d.Allowed || d.Rule != "upload-global" || d.Handle != "" {
		t.Fatalf("upload by b: %+v, want refused by upload-global", d)
	}
	if n := r.mem().Held("key:b", "upload/inflight"); n != 0 {
		t.Fatalf("b holds %d slots after its check was refused, want 0", n)
	}
}

// The region's cap is floor(global cap × the identity's share).
func TestInflightCapFollowsShare(t *testing.T) {
	sh := &mapShares{}
	sh.set("key:half", 0.5)
	sh.set("key:none", 0.2)
	r := newRig(t, `
rules:
  - id: x
    limits: [{name: c, concurrent: 4, timeout: 30s}]
`, nil, func(c *Config) { c.Shares = sh })
	for _, tc := range []struct {
		key  string
		want int
	}{{"half", 2}, {"none", 0}, {"whole", 4}} {
		n := 0
		for range 10 {
			if r.check(t, rules.Attrs{APIKey: tc.key}).Allowed {
				n++
			}
		}
		if n != tc.want {
			t.Errorf("key %q: %d held at once, want %d", tc.key, n, tc.want)
		}
	}
}

// Envoy's negative hits release the key's oldest slot.
func TestInflightReleaseOldest(t *testing.T) {
	r := newRig(t, inflightRules, nil)
	r.check(t, exportsReq)
	r.check(t, exportsReq)
	n, err := r.e.ReleaseOldest(context.Background(), &Request{Attrs: exportsReq})
	if err != nil || n != 1 {
		t.Fatalf("ReleaseOldest: %d, %v; want 1", n, err)
	}
	if got := r.mem().Held("key:k", "exports/inflight"); got != 1 {
		t.Fatalf("%d held, want 1", got)
	}
	n, err = r.e.ReleaseOldest(context.Background(), &Request{Attrs: rules.Attrs{APIKey: "other", Endpoint: "POST /v1/exports"}})
	if err != nil || n != 0 {
		t.Fatalf("ReleaseOldest with nothing held: %d, %v; want 0, nil", n, err)
	}
}

// Without an in-flight store an in-flight limit answers by its fail mode.
func TestInflightNoStore(t *testing.T) {
	r := newRig(t, `
rules:
  - id: open
    match: {endpoint: "/open"}
    limits: [{name: c, concurrent: 1, timeout: 30s}]
  - id: closed
    match: {endpoint: "/closed"}
    fail_mode: closed
    limits: [{name: c, concurrent: 1, timeout: 30s}]
`, func(c clock.Clock) bucket.Store { return takeOnly{bucket.NewMemory(c, 0)} })
	if d := r.check(t, rules.Attrs{APIKey: "k", Endpoint: "/open"}); !d.Allowed || d.Handle != "" {
		t.Fatalf("fail-open: %+v, want allowed without a handle", d)
	}
	if d := r.check(t, rules.Attrs{APIKey: "k", Endpoint: "/closed"}); d.Allowed || d.Source != SourceFailClosed {
		t.Fatalf("fail-closed: %+v, want refused", d)
	}
}

type takeOnly struct{ bucket.Store }

// FuzzDecodeHandle: whatever a client sends as a handle is read or refused with
// ErrInvalid, never a crash, and what encodeHandle writes reads back the same.
func FuzzDecodeHandle(f *testing.F) {
	f.Add(encodeHandle("abc", []heldSlot{{name: "r/c", identity: "key:k"}}))
	f.Add("h1..")
	f.Add("h1.x.AA")
	f.Add("")
	f.Fuzz(func(t *testing.T, h string) {
		id, held, err := decodeHandle(h)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("decodeHandle(%q): %v, want ErrInvalid", h, err)
			}
			return
		}
		if len(held) > maxHeld {
			t.Fatalf("decodeHandle(%q): %d slots, more than %d", h, len(held), maxHeld)
		}
		id2, held2, err := decodeHandle(encodeHandle(id, held))
		if err != nil || id2 != id || len(held2) != len(held) {
			t.Fatalf("round trip of %q: %q %v %v", h, id2, held2, err)
		}
	})
}
