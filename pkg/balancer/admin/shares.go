package admin

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/rules"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// SharesEntry is one (rule, identity)'s shares by region.
type SharesEntry struct {
	Rule string `json:"rule"`
	// Shares is what the regions enforce (the newest published set's entry, or the
	// default split when Default is true).
	Shares  map[string]float64 `json:"shares"`
	Default bool               `json:"default,omitempty"`
	// DefaultSplit is the rule's default split (what the identity returns to).
	DefaultSplit map[string]float64 `json:"default_split,omitempty"`
	// GlobalRate is the rule's first limit's global rate, tokens/s.
	GlobalRate float64 `json:"global_rate,omitempty"`
	// Target, Demand and Pending are the core's (leading only): where the plan is going,
	// the smoothed demand (tokens/s) and whether a step is still waiting.
	Target  map[string]float64 `json:"target,omitempty"`
	Demand  map[string]float64 `json:"demand,omitempty"`
	Pending bool               `json:"pending,omitempty"`
	// Refused is, by region with demand (leading only), the fraction of its demand its
	// bucket refuses at the published share were the demand Poisson: what the share's
	// rate and burst cost the identity (balancer.BurstCost). BurstAdvice, when a region
	// under its rate refuses more than balancer.BurstShortAbove over what one bucket of
	// the limit refuses of the whole demand (its cut of the burst is short), is the burst
	// that would serve every region.
	Refused     map[string]float64    `json:"refused,omitempty"`
	BurstAdvice *balancer.BurstAdvice `json:"burst_advice,omitempty"`
}

// SharesResponse answers GET /v1/admin/shares/{key}.
type SharesResponse struct {
	Identity string `json:"identity"`
	// Source is "core" (this replica leads: its live state) or "etcd" (the published set).
	Source  string        `json:"source"`
	Regions []string      `json:"regions"`
	Entries []SharesEntry `json:"entries"`
	// Version, LeaderRev and PublishedAt are the published head's (etcd source).
	Version     uint64    `json:"version,omitempty"`
	LeaderRev   int64     `json:"leader_rev,omitempty"`
	PublishedAt time.Time `json:"published_at,omitzero"`
}

// identityOf turns the path's key into an identity: an api key ("key:<key>") unless the
// query names another identity (?identity=org:acme).
func identityOf(r *http.Request) string {
	if id := r.URL.Query().Get("identity"); id != "" {
		return id
	}
	return "key:" + r.PathValue("key")
}

func byRegion(regions []string, v []float64) map[string]float64 {
	if len(v) != len(regions) {
		return nil
	}
	m := make(map[string]float64, len(v))
	for i, r := range regions {
		m[r] = v[i]
	}
	return m
}

func (s *Server) shares(_ http.ResponseWriter, r *http.Request, _ string) (any, error) {
	identity := identityOf(r)
	only := r.URL.Query().Get("rule")
	snap := s.cfg.Rules.Current()
	if snap == nil {
		return nil, fmt.Errorf("admin: the balancer has no rules loaded yet")
	}
	regions := s.cfg.Leader.Regions()
	resp := SharesResponse{Identity: identity, Source: "core", Regions: regions, Entries: []SharesEntry{}}
	var published map[string]contract.Entry // by rule, when standing by
	leading := false
	for _, c := range snap.Rules() {
		if (only != "" && c.ID != only) || !countsBy(c.By, identity) {
			continue
		}
		st, tracked, lead := s.cfg.Leader.LeaderIdentity(c.ID, identity)
		leading = lead
		if !lead {
			break
		}
		if tracked {
			e := SharesEntry{Rule: c.ID, Shares: byRegion(regions, st.Published),
				DefaultSplit: byRegion(regions, st.Default), GlobalRate: st.Rate, Target: byRegion(regions, st.Target),
				Demand: byRegion(regions, st.Smoothed), Pending: st.Pending}
			if len(st.Published) == len(regions) && len(st.Smoothed) == len(regions) {
				var refused []float64
				refused, e.BurstAdvice = balancer.BurstCost(c.Global, c.MaxCost(), st.Published, st.Smoothed)
				e.Refused = map[string]float64{}
				for i, r := range regions {
					if !math.IsNaN(refused[i]) {
						e.Refused[r] = refused[i]
					}
				}
			}
			resp.Entries = append(resp.Entries, e)
		}
	}
	if !leading {
		resp.Source = "etcd"
		var err error
		if published, err = s.readPublished(r.Context(), identity, &resp); err != nil {
			return nil, err
		}
		for _, c := range snap.Rules() {
			if e, ok := published[c.ID]; ok && (only == "" || only == c.ID) {
				resp.Entries = append(resp.Entries, SharesEntry{Rule: c.ID, Shares: e.Shares, DefaultSplit: c.Split, GlobalRate: globalRate(c)})
			}
		}
	}
	if len(resp.Entries) == 0 {
		// Not tracked: the rules that would apply to the key alone, at their default split.
		if key, ok := strings.CutPrefix(identity, "key:"); ok {
			for _, m := range snap.Match(&rules.Attrs{APIKey: key}, s.cfg.Clock.Now(), nil) {
				if (only == "" || only == m.Rule.ID) && m.Rule.Mode == rules.ModeEnforce {
					resp.Entries = append(resp.Entries, SharesEntry{Rule: m.Rule.ID, Shares: m.Rule.Split, Default: true, DefaultSplit: m.Rule.Split, GlobalRate: globalRate(m.Rule)})
				}
			}
		}
	}
	return resp, nil
}

// countsBy says whether rules counting by b name identities like identity.
func countsBy(b rules.By, identity string) bool {
	prefix := map[rules.By]string{rules.ByAPIKey: "key:", rules.ByIP: "ip", rules.ByOrg: "org:", rules.ByEndpoint: "ep:", rules.ByGlobal: "global"}[b]
	return strings.HasPrefix(identity, prefix)
}

func globalRate(c *rules.Compiled) float64 {
	if len(c.Global) == 0 {
		return 0
	}
	return c.Global[0].Rate
}

// readPublished reads the published set (head and chunks) and returns identity's entries
// by rule. Chunks of another version than the head names are skipped, as enforcers do.
func (s *Server) readPublished(ctx context.Context, identity string, resp *SharesResponse) (map[string]contract.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	kvs, err := s.cfg.Etcd.Get(ctx, s.cfg.SharesPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("admin: while reading the published shares: %w", err)
	}
	var head contract.Head
	var chunks []contract.Chunk
	for _, kv := range kvs.Kvs {
		k := string(kv.Key)
		if k == contract.HeadKey(s.cfg.SharesPrefix) {
			if head, err = contract.DecodeHead(kv.Value); err != nil {
				return nil, fmt.Errorf("admin: the published head: %w", err)
			}
			continue
		}
		if _, ok := contract.ChunkIndex(s.cfg.SharesPrefix, k); ok {
			if c, err := contract.DecodeChunk(kv.Value); err == nil {
				chunks = append(chunks, c)
			}
		}
	}
	resp.Version, resp.LeaderRev, resp.PublishedAt = head.Version, head.LeaderRev, head.PublishedAt
	if len(head.Regions) > 0 {
		resp.Regions = head.Regions
	}
	out := map[string]contract.Entry{}
	for _, c := range chunks {
		if c.LeaderRev != head.LeaderRev || c.Version != head.ChunkVersion(c.Index) {
			continue
		}
		for _, e := range c.Entries {
			if e.Identity == identity {
				out[e.Rule] = e
			}
		}
	}
	return out, nil
}
