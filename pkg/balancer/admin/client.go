package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Client calls the admin API (the balancer CLI's subcommands). Safe for concurrent use.
type Client struct {
	// Base is the balancer's HTTP address: "http://127.0.0.1:9091" (a bare host:port
	// means http://).
	Base  string
	Token string
	HTTP  *http.Client // nil: http.DefaultClient
}

// APIError is an answer other than 200.
type APIError struct {
	Status int
	ErrorResponse
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s: %s", e.Status, http.StatusText(e.Status), e.ErrorResponse.Error)
	return b.String()
}

// Do sends one request: in (if not nil) as the JSON body, ifMatch (if > 0) as If-Match,
// and decodes a 200's body into out (if not nil).
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, ifMatch int64, in, out any) error {
	base := c.Base
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u := strings.TrimRight(base, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if ifMatch > 0 {
		req.Header.Set("If-Match", strconv.FormatInt(ifMatch, 10))
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		e := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(data, &e.ErrorResponse) != nil || e.ErrorResponse.Error == "" {
			e.ErrorResponse.Error = strings.TrimSpace(string(data))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("admin: the answer to %s %s does not decode: %w", method, path, err)
		}
	}
	return nil
}

// Rules lists the rules in etcd.
func (c *Client) Rules(ctx context.Context) (RulesResponse, error) {
	var r RulesResponse
	return r, c.Do(ctx, http.MethodGet, "/v1/admin/rules", nil, 0, nil, &r)
}

// Overrides lists the per-key overrides.
func (c *Client) Overrides(ctx context.Context) (RulesResponse, error) {
	var r RulesResponse
	return r, c.Do(ctx, http.MethodGet, "/v1/admin/overrides", nil, 0, nil, &r)
}

// Apply applies a rule file compared on req.Revision; with revision 0 it reads the
// current revision first (the change still fails with 409 if another lands between).
func (c *Client) Apply(ctx context.Context, req ApplyRequest) (Result, error) {
	if req.Revision == 0 {
		l, err := c.Rules(ctx)
		if err != nil {
			return Result{}, err
		}
		req.Revision = l.Revision
	}
	var r Result
	return r, c.Do(ctx, http.MethodPut, "/v1/admin/rules", nil, 0, req, &r)
}

// SetOverride sets key's override (revision as in Apply).
func (c *Client) SetOverride(ctx context.Context, key string, req OverrideRequest) (Result, error) {
	if req.Revision == 0 {
		l, err := c.Rules(ctx)
		if err != nil {
			return Result{}, err
		}
		req.Revision = l.Revision
	}
	var r Result
	return r, c.Do(ctx, http.MethodPut, "/v1/admin/overrides/"+url.PathEscape(key), nil, 0, req, &r)
}

// Delete deletes a rule ("rules") or an override ("overrides") by id or key.
func (c *Client) Delete(ctx context.Context, kind, name, reason string, revision int64) (Result, error) {
	if revision == 0 {
		l, err := c.Rules(ctx)
		if err != nil {
			return Result{}, err
		}
		revision = l.Revision
	}
	var r Result
	return r, c.Do(ctx, http.MethodDelete, "/v1/admin/"+kind+"/"+url.PathEscape(name), url.Values{"reason": {reason}}, revision, nil, &r)
}

// Check checks a rule file without applying it.
func (c *Client) Check(ctx context.Context, file, yaml string) (CheckResponse, error) {
	var r CheckResponse
	return r, c.Do(ctx, http.MethodPost, "/v1/admin/check", nil, 0, CheckRequest{File: file, YAML: yaml}, &r)
}

// Shares reads an api key's shares.
func (c *Client) Shares(ctx context.Context, key string) (SharesResponse, error) {
	var r SharesResponse
	return r, c.Do(ctx, http.MethodGet, "/v1/admin/shares/"+url.PathEscape(key), nil, 0, nil, &r)
}

// Audit lists the newest audit records.
func (c *Client) Audit(ctx context.Context, limit int) ([]AuditRecord, error) {
	var r struct {
		Records []AuditRecord `json:"records"`
	}
	err := c.Do(ctx, http.MethodGet, "/v1/admin/audit", url.Values{"limit": {strconv.Itoa(limit)}}, 0, nil, &r)
	return r.Records, err
}

// Explain asks every enforcer why a request with these attributes (api_key, plan, org,
// endpoint, ip, hits) is limited.
func (c *Client) Explain(ctx context.Context, q url.Values) (ExplainResponse, error) {
	var r ExplainResponse
	return r, c.Do(ctx, http.MethodGet, "/v1/admin/explain", q, 0, nil, &r)
}
