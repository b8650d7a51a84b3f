package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// How every route is served: wrap authenticates the caller (one of the named bearer
// tokens) before anything is read, bounds the body, runs the route and writes its answer
// as JSON, or its error with the status the error names (writeError); decode reads a JSON
// body, revision the revision a change is compared on.

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
	// Problems lists each problem of a refused rule set.
	Problems []Problem `json:"problems,omitempty"`
}

// wrap authenticates, runs h and writes its answer (200 with v as JSON) or its error.
func (s *Server) wrap(h func(w http.ResponseWriter, r *http.Request, who string) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, err := s.cfg.Tokens.Authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="allot-admin"`)
			// The body is never read: closing the connection after the answer keeps net/http
			// from draining it (a slow body would hold the connection until the read timeout).
			w.Header().Set("Connection", "close")
			writeJSON(w, http.StatusUnauthorized, ErrorResponse{Error: err.Error()})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		v, err := h(w, r, who)
		if err != nil {
			s.writeError(w, r, who, err)
			return
		}
		if v != nil {
			writeJSON(w, http.StatusOK, v)
		}
	})
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, who string, err error) {
	code := http.StatusInternalServerError
	resp := ErrorResponse{Error: err.Error()}
	var inv *InvalidError
	switch {
	case errors.As(err, &inv):
		code, resp.Problems = http.StatusBadRequest, problems(inv.Err)
	case errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code = http.StatusServiceUnavailable
	}
	if code >= 500 {
		s.cfg.Logger.Warn("admin request failed", "method", r.Method, "path", r.URL.Path, "who", who, "error", err)
	}
	writeJSON(w, code, resp)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// decode reads one JSON value with unknown fields refused.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: body: %v", ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: body: more than one JSON value", ErrBadRequest)
	}
	return nil
}

// revision is the revision a change is compared on: If-Match (a number, quotes allowed)
// or the body's field; both set must agree.
func revision(r *http.Request, body int64) (int64, error) {
	h := strings.Trim(strings.TrimPrefix(r.Header.Get("If-Match"), "W/"), `"`)
	if h == "" {
		h = r.URL.Query().Get("revision")
	}
	if h == "" {
		return body, nil
	}
	n, err := strconv.ParseInt(h, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: If-Match/revision %.30q is not a revision (a positive number from a read)", ErrBadRequest, h)
	}
	if body != 0 && body != n {
		return 0, fmt.Errorf("%w: If-Match %d and body revision %d disagree", ErrBadRequest, n, body)
	}
	return n, nil
}
