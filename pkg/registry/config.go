package registry

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/hashicorp/go-hclog"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
)

// Config configures a Registry. Start from DefaultConfig and set Region, ID and Addr.
// New fills zero-valued optional fields (Prefix, TTL, timeouts, backoff, Logger, Clock)
// with their defaults; Region, ID and Addr have none.
type Config struct {
	// Prefix is the etcd key prefix under which every region's enforcers register, as
	// <Prefix><Region>/<ID>. It must start and end with "/". Default contract.EnforcersPrefix.
	Prefix string

	// Region is this enforcer's region; peers are counted within it. Required; no "/",
	// spaces or control characters; at most 128 bytes.
	Region string

	// ID identifies this enforcer within its region. Two live enforcers with the same ID
	// in one region are reported as a duplicate (ErrDuplicateID). Same rules as Region.
	ID string

	// Addr is the address this enforcer serves on, for operators and debugging. Required.
	Addr string
	// HTTPAddr is the address of this enforcer's HTTP API (/v1/explain), when it serves
	// one: the balancer's `explain` asks every region's enforcers there. Optional.
	HTTPAddr string

	// TTL is the lease time to live: how long after this process dies (or loses etcd)
	// its registration disappears and the others stop counting it. etcd leases are whole
	// seconds, so TTL must be a whole number of seconds, at least 1s (the server may raise
	// a small TTL to its own minimum, typically 2s). Default 10s.
	TTL time.Duration

	// RequestTimeout bounds each etcd call the registry makes (grant, claim, list).
	// Default 2s.
	RequestTimeout time.Duration

	// RevokeTimeout bounds the lease revoke Close does to release the registration
	// promptly. If it expires the registration lingers until TTL. Default 1s.
	RevokeTimeout time.Duration

	// BackoffMin and BackoffMax bound the jittered exponential backoff between failed
	// attempts to register or to list peers. Defaults 100ms and 2s.
	BackoffMin, BackoffMax time.Duration

	// Logger receives state changes (registered, lease lost, duplicate ID, watch
	// restarts). Default: a null logger.
	Logger hclog.Logger

	// Clock times the registry's own backoff and health checks. Default clock.Real().
	// (The etcd client keeps lease keep-alives on the wall clock regardless.)
	Clock clock.Clock
}

// DefaultConfig returns a Config with every default filled in; Region, ID and Addr are
// left empty for the caller.
func DefaultConfig() Config {
	return Config{
		Prefix:         contract.EnforcersPrefix,
		TTL:            10 * time.Second,
		RequestTimeout: 2 * time.Second,
		RevokeTimeout:  time.Second,
		BackoffMin:     100 * time.Millisecond,
		BackoffMax:     2 * time.Second,
		Logger:         hclog.NewNullLogger(),
		Clock:          clock.Real(),
	}
}

// withDefaults returns c with zero optional fields set from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.TTL == 0 {
		c.TTL = d.TTL
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = d.RequestTimeout
	}
	if c.RevokeTimeout == 0 {
		c.RevokeTimeout = d.RevokeTimeout
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = d.BackoffMin
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = d.BackoffMax
	}
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	if c.Clock == nil {
		c.Clock = d.Clock
	}
	return c
}

// Validate reports the first invalid field of c, naming the field and its value. It
// checks c as given: zero optional fields are errors here even though New would fill
// them.
func (c Config) Validate() error {
	if c.Prefix == "" || !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") {
		return fmt.Errorf("registry: Prefix %q must start and end with \"/\"", c.Prefix)
	}
	if err := validName("Region", c.Region); err != nil {
		return err
	}
	if err := validName("ID", c.ID); err != nil {
		return err
	}
	if strings.TrimSpace(c.Addr) == "" {
		return fmt.Errorf("registry: Addr %q must not be empty", c.Addr)
	}
	if c.TTL < time.Second || c.TTL%time.Second != 0 {
		return fmt.Errorf("registry: TTL %s must be a whole number of seconds, at least 1s", c.TTL)
	}
	if c.RequestTimeout <= 0 {
		return fmt.Errorf("registry: RequestTimeout %s must be positive", c.RequestTimeout)
	}
	if c.RevokeTimeout <= 0 {
		return fmt.Errorf("registry: RevokeTimeout %s must be positive", c.RevokeTimeout)
	}
	if c.BackoffMin <= 0 {
		return fmt.Errorf("registry: BackoffMin %s must be positive", c.BackoffMin)
	}
	if c.BackoffMax < c.BackoffMin {
		return fmt.Errorf("registry: BackoffMax %s must be at least BackoffMin %s", c.BackoffMax, c.BackoffMin)
	}
	if c.Logger == nil {
		return fmt.Errorf("registry: Logger must not be nil")
	}
	if c.Clock == nil {
		return fmt.Errorf("registry: Clock must not be nil")
	}
	return nil
}

// validName checks a Region or ID: it becomes one etcd key segment.
func validName(field, v string) error {
	if v == "" {
		return fmt.Errorf("registry: %s must not be empty", field)
	}
	if len(v) > 128 {
		return fmt.Errorf("registry: %s %.20q... is %d bytes, more than 128", field, v, len(v))
	}
	for _, r := range v {
		if r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("registry: %s %q must not contain %q", field, v, r)
		}
	}
	return nil
}
