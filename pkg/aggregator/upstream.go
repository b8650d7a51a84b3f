package aggregator

// The upstream side: forwarding to the balancer leader, found through Config.Upstream or
// round Config.Addrs.

import (
	"context"
	"errors"
	"fmt"

	"github.com/allot-dev/allot/pkg/enforcer/report"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var errStandby = errors.New("aggregator: balancer standby knows no leader")

// send makes one attempt at the leader, following at most two standby redirects; with
// Addrs, once round the list (sendList).
func (a *Aggregator) send(ctx context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	if a.ring != nil {
		return a.sendList(ctx, req)
	}
	addr := a.addr
	if addr == "" {
		lctx, cancel := context.WithTimeout(ctx, a.cfg.SendTimeout)
		l, err := a.cfg.Upstream.Leader(lctx)
		cancel()
		if err != nil {
			return nil, err
		}
		addr = l
	}
	for redirects := 0; ; redirects++ {
		resp, err := a.sendOnce(ctx, addr, req)
		switch {
		case err != nil:
			return nil, err
		case resp.GetAccepted():
			a.addr = addr
			return resp, nil
		case resp.GetLeaderAddr() == "" || resp.GetLeaderAddr() == addr:
			return nil, fmt.Errorf("%w (asked %s)", errStandby, addr)
		case redirects == 2:
			return nil, fmt.Errorf("aggregator: too many balancer redirects: %s points at %s", addr, resp.GetLeaderAddr())
		}
		addr = resp.GetLeaderAddr()
	}
}

// sendList makes one attempt over Addrs: every address at most once, from the one that
// last accepted. The error joins every address's.
func (a *Aggregator) sendList(ctx context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	var errs []error
	p := a.ring.Pass()
	for addr, ok := p.Addr(); ok; addr, ok = p.Addr() {
		resp, err := a.sendOnce(ctx, addr, req)
		if err == nil && resp.GetAccepted() {
			p.Accepted()
			return resp, nil
		}
		redirect := ""
		if err == nil {
			redirect = resp.GetLeaderAddr()
			err = fmt.Errorf("%w (asked %s, it names %q)", errStandby, addr, redirect)
		}
		errs = append(errs, err)
		a.closeConn() // the next address, or a fresh connection for the retry
		p.Failed(redirect)
		if ctx.Err() != nil || status.Code(err) == codes.InvalidArgument {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// sendOnce sends req to addr once.
func (a *Aggregator) sendOnce(ctx context.Context, addr string, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	cc, err := a.dial(addr)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, a.cfg.SendTimeout)
	defer cancel()
	resp, err := allotv1.NewBalancerClient(cc).Report(rctx, req)
	if err != nil {
		return nil, fmt.Errorf("while forwarding to %s: %w", addr, err)
	}
	return resp, nil
}

func (a *Aggregator) dial(addr string) (*grpc.ClientConn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil && a.connAddr == addr {
		return a.conn, nil
	}
	if a.conn != nil {
		_ = a.conn.Close()
	}
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{a.creds}, a.cfg.DialOptions...)...)
	if err != nil {
		a.conn = nil
		return nil, fmt.Errorf("while dialling balancer %s: %w", addr, err)
	}
	a.conn, a.connAddr = cc, addr
	return cc, nil
}

func (a *Aggregator) closeConn() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		_ = a.conn.Close()
		a.conn = nil
	}
}

// CheckAddr reports whether addr is a usable "host:port" for Config.Addrs (the check the
// enforcers' balancer addresses get, report.CheckAddr), for a config's validation.
func CheckAddr(addr string) error { return report.CheckAddr(addr) }

// EtcdUpstream finds the balancer leader on its election prefix in etcd (an empty prefix
// means contract.ElectionPrefix): Config.Upstream in production.
func EtcdUpstream(cli *clientv3.Client, prefix string) report.LeaderSource {
	return report.EtcdLeader(cli, prefix)
}
