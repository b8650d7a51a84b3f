package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
)

const adminSecret = "ops-secret-0123456789"

func explainServer(t *testing.T, customers bool) *httptest.Server {
	t.Helper()
	rig := enforcertest.New(t, testRules)
	tokens, err := adminauth.Parse("ops:" + adminSecret)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ExplainHandler(rig.E, ExplainConfig{Tokens: tokens, Customers: customers}))
	t.Cleanup(srv.Close)
	return srv
}

func getExplain(t *testing.T, url string, hdr map[string]string) (int, string, enforcer.Explanation) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var x enforcer.Explanation
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &x); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
	}
	return resp.StatusCode, string(b), x
}

func TestExplainExposure(t *testing.T) {
	admin := map[string]string{"Authorization": "Bearer " + adminSecret}
	t.Run("admin sees any key", func(t *testing.T) {
		srv := explainServer(t, false)
		code, body, x := getExplain(t, srv.URL+"/?api_key=someone&endpoint=GET+/v1/ip-limited&ip=192.0.2.1", admin)
		if code != 200 || !x.Admin || len(x.Rules) != 3 {
			t.Fatalf("%d %s", code, body)
		}
		for _, re := range x.Rules {
			if re.Redacted {
				t.Fatalf("admin view redacted %+v", re)
			}
		}
	})
	t.Run("without customers, a token is needed", func(t *testing.T) {
		srv := explainServer(t, false)
		if code, body, _ := getExplain(t, srv.URL+"/?api_key=k", map[string]string{"X-Api-Key": "k"}); code != 401 || !strings.Contains(body, "needs an admin token") {
			t.Fatalf("%d %s", code, body)
		}
		if code, body, _ := getExplain(t, srv.URL+"/?api_key=k", map[string]string{"Authorization": "Bearer wrong-token-0123456789"}); code != 401 {
			t.Fatalf("wrong token: %d %s", code, body)
		}
	})
	t.Run("a customer sees only their own key", func(t *testing.T) {
		srv := explainServer(t, true)
		own := map[string]string{"X-Api-Key": "mine"}
		code, body, x := getExplain(t, srv.URL+"/?endpoint=GET+/v1/ip-limited&ip=192.0.2.1", own)
		if code != 200 || x.Admin {
			t.Fatalf("%d %s", code, body)
		}
		for _, re := range x.Rules {
			switch {
			case re.By == "api_key" && (re.Redacted || re.Identity != "key:mine" || re.Limits[0].Level == nil):
				t.Fatalf("own bucket hidden: %+v", re)
			case re.By != "api_key" && (!re.Redacted || re.Identity != "" || re.Limits[0].Level != nil):
				t.Fatalf("a shared bucket shown to a customer: %+v", re)
			}
		}
		if code, body, _ := getExplain(t, srv.URL+"/?api_key=someone-else", own); code != 403 || !strings.Contains(body, "only their own key") {
			t.Fatalf("another key: %d %s", code, body)
		}
		if code, _, _ := getExplain(t, srv.URL+"/?api_key=mine", nil); code != 401 {
			t.Fatalf("no key header: %d", code)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		srv := explainServer(t, false)
		for q, want := range map[string]string{"?colour=red": "unknown parameter", "?ip=nope": "not an IP address", "?hits=x": "not a whole number"} {
			if code, body, _ := getExplain(t, srv.URL+"/"+q, admin); code != 400 || !strings.Contains(body, want) {
				t.Errorf("%s: %d %s", q, code, body)
			}
		}
	})
}
