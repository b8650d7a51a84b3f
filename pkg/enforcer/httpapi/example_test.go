package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
)

// A Go gateway limits its own handlers: two requests a minute per API key here.
func ExampleMiddleware() {
	set, err := rules.ParseYAML([]byte(`
rules:
  - id: per-key
    limits: [{name: minute, rate: 2, per: 1m}]
`))
	if err != nil {
		panic(err)
	}
	snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east"})
	if err != nil {
		panic(err)
	}
	cfg := enforcer.DefaultConfig()
	cfg.Region, cfg.Rules, cfg.Registerer = "us-east", rules.NewHolder(snap), prometheus.NewRegistry()
	cfg.Store = bucket.NewMemory(clock.Real(), 0) // in production: fallback → lease → redis
	cfg.ResetJitterMax = 0
	e, err := enforcer.New(cfg)
	if err != nil {
		panic(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") })
	h := httpapi.Middleware(e, nil, api)
	for i := 0; i < 3; i++ {
		r := httptest.NewRequest("GET", "/v1/items", nil)
		r.Header.Set("X-Api-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "per-key/minute";q=2;w=60 "per-key/minute";r=1;t=30
	// 200 "per-key/minute";q=2;w=60 "per-key/minute";r=0;t=0
	// 429 "per-key/minute";q=2;w=60 "per-key/minute";r=0;t=0
}
