package httpapi

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"

	"github.com/allot-dev/allot/pkg/enforcer"
)

// SettleRequest is the body of POST /v1/settle: a check's settle_handle and the request's
// actual cost, in the unit of the check's hits (the estimate). Unknown fields are an
// error.
type SettleRequest struct {
	Handle string `json:"handle"`
	Cost   int64  `json:"cost"`
}

// SettleResponse is the body POST /v1/settle answers with: 200 and settled (the rules
// settled, and the bucket left lowest: remaining is negative while it is in debt); 404
// with error when the handle is unknown, expired or settled already (nothing is settled
// twice, also when two enforcers receive it at once); 400 for a handle this enforcer
// cannot read or a cost out of range; 503 when the store could not answer (nothing was
// settled: send it again within the window, or the estimate stands).
type SettleResponse struct {
	Settled   int    `json:"settled"`
	Rule      string `json:"rule,omitempty"`
	Limit     string `json:"limit,omitempty"`
	Remaining int64  `json:"remaining"`
	Error     string `json:"error,omitempty"`
}

func (h *handler) settle(w http.ResponseWriter, req *http.Request) {
	var in SettleRequest
	if !h.readJSON(w, req, &in) {
		return
	}
	res, err := h.e.Settle(req.Context(), in.Handle, in.Cost)
	out := SettleResponse{Settled: res.Settled, Rule: res.Rule, Limit: res.Limit, Remaining: res.Remaining}
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, out)
	case errors.Is(err, enforcer.ErrInvalid):
		writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: err.Error()})
	case errors.Is(err, enforcer.ErrUnknownSettle):
		out.Error = err.Error()
		writeJSON(w, http.StatusNotFound, out)
	default:
		out.Error = err.Error()
		writeJSON(w, http.StatusServiceUnavailable, out)
	}
}

// costKey is the context key of a request's cost report (MiddlewareWithCost).
type costKey struct{}

type costReport struct {
	cost atomic.Int64 // -1 until reported
}

// ReportCost tells MiddlewareWithCost the request's actual cost, in the unit its estimate
// is in. The handler calls it once the cost is known (the last call wins); it reports
// false when the request did not pass through MiddlewareWithCost. Safe for concurrent
// use.
func ReportCost(ctx context.Context, cost int64) bool {
	c, ok := ctx.Value(costKey{}).(*costReport)
	if !ok || cost < 0 {
		return false
	}
	c.cost.Store(cost)
	return true
}

// MiddlewareWithCost is Middleware for requests whose cost is known only after they are
// served (LLM tokens, rows, bytes): each request is checked with estimate(r) hits and,
// allowed, passed to next with a context in which the handler calls ReportCost with the
// actual cost; when next returns, the difference is settled (Enforcer.Settle). A handler
// that reports nothing leaves the estimate; a settlement that fails (the store
// unreachable) is not retried and the estimate stands. estimate nil means 1.
func MiddlewareWithCost(e *enforcer.Enforcer, attrs AttrsFunc, estimate func(*http.Request) int64, next http.Handler) http.Handler {
	if attrs == nil {
		attrs = DefaultAttrs
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := enforcer.Request{Attrs: attrs(r), Settle: true}
		if estimate != nil {
			req.Hits = estimate(r)
		}
		d, ok := checkAndHeaders(r.Context(), e, w, &req)
		if !ok {
			return
		}
		if d.Handle != "" {
			defer func() { _ = e.Release(context.WithoutCancel(r.Context()), d.Handle) }()
		}
		c := &costReport{}
		c.cost.Store(-1)
		if d.SettleHandle != "" {
			defer func() {
				if n := c.cost.Load(); n >= 0 {
					_, _ = e.Settle(context.WithoutCancel(r.Context()), d.SettleHandle, n)
				}
			}()
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), costKey{}, c)))
	})
}
