package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/allot-dev/allot/pkg/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxExplainEnforcers bounds how many enforcers one explain asks (the first by region and
// id): an answer per enforcer is a few kB.
const MaxExplainEnforcers = 64

// EnforcerExplain is one enforcer's answer to /v1/explain.
type EnforcerExplain struct {
	Region string `json:"region"`
	ID     string `json:"id"`
	Addr   string `json:"addr"`
	Status int    `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
	// Explain is the enforcer's JSON answer as it sent it (httpapi.ExplainResponse).
	Explain json.RawMessage `json:"explain,omitempty"`
}

// ExplainResponse answers GET /v1/admin/explain.
type ExplainResponse struct {
	Enforcers []EnforcerExplain `json:"enforcers"`
	// Skipped counts enforcers not asked: over MaxExplainEnforcers, or registered without
	// an HTTP address.
	Skipped int `json:"skipped,omitempty"`
}

// explain asks every registered enforcer's /v1/explain with the same query, forwarding
// the caller's token (the enforcers must accept the same admin tokens), concurrently,
// each bounded by ExplainClient's timeout.
func (s *Server) explain(_ http.ResponseWriter, r *http.Request, _ string) (any, error) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	resp, err := s.cfg.Etcd.Get(ctx, s.cfg.RegistryPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("admin: while listing the enforcers in etcd: %w", err)
	}
	var out ExplainResponse
	var members []registry.Member
	for _, kv := range resp.Kvs {
		var m registry.Member
		if json.Unmarshal(kv.Value, &m) != nil || m.HTTPAddr == "" {
			out.Skipped++
			continue
		}
		members = append(members, m)
	}
	sort.Slice(members, func(i, j int) bool {
		if members[i].Region != members[j].Region {
			return members[i].Region < members[j].Region
		}
		return members[i].ID < members[j].ID
	})
	if len(members) > MaxExplainEnforcers {
		out.Skipped += len(members) - MaxExplainEnforcers
		members = members[:MaxExplainEnforcers]
	}
	out.Enforcers = make([]EnforcerExplain, len(members))
	auth := r.Header.Get("Authorization")
	query := r.URL.Query().Encode()
	var wg sync.WaitGroup
	for i, m := range members {
		out.Enforcers[i] = EnforcerExplain{Region: m.Region, ID: m.ID, Addr: m.HTTPAddr}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.askOne(r.Context(), &out.Enforcers[i], auth, query)
		}()
	}
	wg.Wait()
	return out, nil
}

func (s *Server) askOne(ctx context.Context, e *EnforcerExplain, auth, query string) {
	u := url.URL{Scheme: s.cfg.ExplainScheme, Host: e.Addr, Path: "/v1/explain", RawQuery: query}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		e.Error = err.Error()
		return
	}
	req.Header.Set("Authorization", auth)
	resp, err := s.cfg.ExplainClient.Do(req)
	if err != nil {
		e.Error = err.Error()
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e.Status = resp.StatusCode
	switch {
	case err != nil:
		e.Error = err.Error()
	case resp.StatusCode != http.StatusOK:
		e.Error = answerError(resp.StatusCode, body)
	case !json.Valid(body):
		e.Error = "the answer is not JSON"
	default:
		e.Explain = body
	}
}

// answerError is an enforcer's refusal as one line: its JSON {"error": ...} (an enforcer
// with explain off names what to turn on), or its text; a bare 404 (an enforcer too old to
// say) is said to be explain being off.
func answerError(status int, body []byte) string {
	var er ErrorResponse
	if json.Unmarshal(body, &er) == nil && er.Error != "" {
		return fmt.Sprintf("%d: %s", status, er.Error)
	}
	text := strings.TrimSpace(string(body))
	if status == http.StatusNotFound {
		return "404: no /v1/explain here: explain is off on this enforcer (explain.enabled in its config, or -explain)"
	}
	return fmt.Sprintf("%d: %s", status, text)
}
