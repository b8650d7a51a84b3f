package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/hashicorp/go-hclog"
)

const settleRules = `
rules:
  - id: llm
    limits: [{name: minute, rate: 100, per: 1m}]
`

// POST /v1/check with settle answers a settle_handle; POST /v1/settle takes the
// difference once: again is 404, junk 400.
func TestCheckAndSettle(t *testing.T) {
	rig := enforcertest.New(t, settleRules)
	srv := httptest.NewServer(Handler(rig.E, Config{}, rig.Reg, nil, hclog.NewNullLogger()))
	t.Cleanup(srv.Close)
	code, b := postTo(t, srv.URL+"/v1/check", `{"api_key":"k","hits":20,"settle":true}`)
	var out CheckResponse
	if err := json.Unmarshal(b, &out); err != nil || code != 200 || out.SettleHandle == "" || out.Remaining != 80 {
		t.Fatalf("check: %d %s", code, b)
	}
	body, _ := json.Marshal(SettleRequest{Handle: out.SettleHandle, Cost: 5})
	code, b = postTo(t, srv.URL+"/v1/settle", string(body))
	var res SettleResponse
	if err := json.Unmarshal(b, &res); err != nil || code != 200 || res.Settled != 1 || res.Remaining != 95 || res.Limit != "llm/minute" {
		t.Fatalf("settle 5 of 20: %d %s, want 95 left", code, b)
	}
	if code, b := postTo(t, srv.URL+"/v1/settle", string(body)); code != 404 || !strings.Contains(string(b), "already settled") {
		t.Fatalf("second settle: %d %s, want 404", code, b)
	}
	for _, bad := range []string{`{"handle":"nope","cost":1}`, `{"handle":""}`, `{"handle":"x","cots":1}`, `[`, ``,
		`{"handle":"` + out.SettleHandle + `","cost":-3}`} {
		if code, b := postTo(t, srv.URL+"/v1/settle", bad); code != 400 {
			t.Errorf("settle %q: %d %s, want 400", bad, code, b)
		}
	}
}

// MiddlewareWithCost checks the estimate and settles what the handler reports.
func TestMiddlewareWithCost(t *testing.T) {
	rig := enforcertest.New(t, settleRules)
	cost := int64(30)
	h := MiddlewareWithCost(rig.E, func(*http.Request) rules.Attrs { return rules.Attrs{APIKey: "k"} },
		func(*http.Request) int64 { return 10 },
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if cost >= 0 && !ReportCost(r.Context(), cost) {
				t.Error("ReportCost: not under MiddlewareWithCost")
			}
		}))
	serve := func() int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Code
	}
	remaining := func() int64 {
		d, err := rig.E.Check(t.Context(), &enforcer.Request{Attrs: rules.Attrs{APIKey: "k"}, Peek: true})
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	if c := serve(); c != 200 || remaining() != 70 {
		t.Fatalf("estimate 10, actual 30: %d, %d left, want 70", c, remaining())
	}
	cost = 0
	if c := serve(); c != 200 || remaining() != 70 {
		t.Fatalf("estimate 10, actual 0: %d, %d left, want 70 (refunded)", c, remaining())
	}
	cost = -1 // not reported: the estimate stands
	if c := serve(); c != 200 || remaining() != 60 {
		t.Fatalf("estimate 10, nothing reported: %d, %d left, want 60", c, remaining())
	}
	if ReportCost(t.Context(), 1) {
		t.Fatal("ReportCost outside the middleware reported true")
	}
}
