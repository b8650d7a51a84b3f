package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The audit log: each change writes one AuditRecord in its own transaction (apply,
// store.go) under a key that orders the records by time; the newest AuditKeep are kept
// (pruneAudit), and GET /v1/admin/audit lists them newest first (?limit=, default 50).

// AuditRecord is one change as kept in etcd under the audit prefix.
type AuditRecord struct {
	At     time.Time `json:"at"`
	Who    string    `json:"who"`    // the admin token's name
	Action string    `json:"action"` // rules.apply, rule.put, rule.delete, override.set, override.delete
	Rules  []string  `json:"rules"`  // the rule ids written or deleted
	Reason string    `json:"reason"`
	// ReadRevision is the revision the change was compared on; Revision the change's own
	// (the record's etcd mod revision, filled when listed).
	ReadRevision int64  `json:"read_revision"`
	Revision     int64  `json:"revision,omitempty"`
	Key          string `json:"key,omitempty"`
}

// auditKey orders records by time: <prefix><20-digit Unix ns>-<4 random hex>.
func (s *Server) auditKey(now time.Time) string {
	var b [2]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s%020d-%s", s.cfg.AuditPrefix, now.UnixNano(), hex.EncodeToString(b[:]))
}

// pruneAudit keeps the newest AuditKeep records: the older are deleted after each change
// (a failure is logged; the next change prunes again).
func (s *Server) pruneAudit(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := s.cfg.Etcd.Get(ctx, s.cfg.AuditPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		s.cfg.Logger.Warn("could not read the audit records to prune them", "error", err)
		return
	}
	n := len(resp.Kvs) - s.cfg.AuditKeep
	if n <= 0 {
		return
	}
	first, end := string(resp.Kvs[0].Key), string(resp.Kvs[n].Key)
	if _, err := s.cfg.Etcd.Delete(ctx, first, clientv3.WithRange(end)); err != nil {
		s.cfg.Logger.Warn("could not prune the audit records", "error", err)
	}
}

func (s *Server) audit(ctx context.Context, limit int) ([]AuditRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := s.cfg.Etcd.Get(ctx, s.cfg.AuditPrefix, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("admin: while reading the audit records: %w", err)
	}
	out := make([]AuditRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r AuditRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			r = AuditRecord{Reason: "undecodable record: " + err.Error()}
		}
		r.Revision, r.Key = kv.ModRevision, string(kv.Key)
		out = append(out, r)
	}
	return out, nil
}

func (s *Server) listAudit(_ http.ResponseWriter, r *http.Request, _ string) (any, error) {
	limit := 50
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > s.cfg.AuditKeep {
			return nil, fmt.Errorf("%w: limit %.20q, want 1-%d", ErrBadRequest, v, s.cfg.AuditKeep)
		}
		limit = n
	}
	recs, err := s.audit(r.Context(), limit)
	if err != nil {
		return nil, err
	}
	return map[string]any{"keep": s.cfg.AuditKeep, "records": recs}, nil
}
